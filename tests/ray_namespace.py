"""Ray clusters for tests and benchmarks, only ever inside a network and PID namespace of their own.

Outside such a namespace Ray registers the machine's own interface address; a test must never reach it. So a test
(tests/test_verify_ray.py) or a benchmark (bench/bench_verify_ray.py) re-executes a script under
`unshare -n -p -f --mount-proc --kill-child` with `ip link set lo up` first: the script is PID 1 of a namespace whose
only interface is loopback, every Ray address is 127.0.0.1, and when it exits the kernel kills whatever it left.
`ray.cluster_utils.Cluster` (ray 2.60.0, python/ray/cluster_utils.py) starts the nodes: each `add_node` is a raylet
(plus the GCS for the head) as child processes of the script, with its own resources, e.g. `{"lean_workers": 2}`.
"""
import os, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNSHARE = ['unshare', '-n', '-p', '-f', '--mount-proc', '--kill-child']
INSIDE = 'EI_TEST_NAMESPACE'     # set in the environment of the script that runs inside


def namespace_refusal() -> str | None:
    "Why a namespace of our own cannot be made here (None when it can): the reason a test skips with."
    if not shutil.which('unshare') or not shutil.which('ip'): return 'unshare or ip (util-linux, iproute2) not found'
    try: r = subprocess.run(UNSHARE + ['sh', '-c', 'ip link set lo up && echo ok'], capture_output=True, text=True,
                            timeout=60)
    except subprocess.TimeoutExpired: return 'unshare did not answer within 60 s'
    if r.returncode or 'ok' not in r.stdout:
        why = r.stderr.strip()[:160]
        return f'unshare -n -p -f --mount-proc is not permitted here (root, or user namespaces): {why}'
    return None


def run_in_namespace(script, args=(), timeout: float = 600, capture: bool = True) -> subprocess.CompletedProcess:
    "Run `python script ARGS` as PID 1 of a new network + PID namespace with only `lo` up."
    tmp = tempfile.mkdtemp(prefix='eiray', dir='/tmp')   # Ray's sessions and its address file: private, removed after
    path = os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    env = {**os.environ, INSIDE: '1', 'PYTHONPATH': path,
           'RAY_USAGE_STATS_ENABLED': '0', 'OMP_NUM_THREADS': '1', 'RAY_TMPDIR': tmp}
    cmd = UNSHARE + ['sh', '-c', 'ip link set lo up && exec "$0" "$@"', sys.executable, str(script), *map(str, args)]
    try: return subprocess.run(cmd, env=env, capture_output=capture, text=True, timeout=timeout)
    finally: shutil.rmtree(tmp, ignore_errors=True)


def inside() -> bool:
    "Whether this process is the namespace's PID 1 started by `run_in_namespace`."
    return os.environ.get(INSIDE) == '1' and os.getpid() == 1


def start_cluster(lean_workers=(2,), head_lean: int = 2, head_cpus: int = 1, tries: int = 3):
    "A `Cluster`: a head offering `head_lean` Lean workers, then one node per entry offering that many. Inside only."
    assert inside(), 'Ray is started only inside a namespace of our own (run_in_namespace)'
    import ray
    from ray.cluster_utils import Cluster
    ip = dict(node_ip_address='127.0.0.1')
    for attempt in range(tries):   # Ray gives a raylet 30 s to register (ray/_private/node.py): loaded machines miss it
        try:
            c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=head_cpus, include_dashboard=False,
                                                                  resources={'lean_workers': head_lean}, **ip))
            nodes = [c.add_node(num_cpus=1, resources={'lean_workers': k}, **ip) for k in lean_workers]
            c.wait_for_nodes()
            break
        except Exception as e:
            if attempt == tries - 1: raise
            print(f'start_cluster: {type(e).__name__}: {e}; again', file=sys.stderr, flush=True)
            for p in processes(): _kill(p['pid'])      # this namespace's processes only: we are its PID 1
    ray.init(address=c.address, logging_level='ERROR', log_to_driver=False)
    return c, nodes


def _kill(pid):
    try: os.kill(pid, 9)
    except ProcessLookupError: pass


def processes() -> list[dict]:
    "The live processes of this namespace (zombies reaped first), but this one and `ps`."
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0: break
        except ChildProcessError: break
    out = subprocess.run(['ps', '-eo', 'pid=,stat=,args='], capture_output=True, text=True).stdout
    rows = [l.split(None, 2) for l in out.splitlines() if l.strip()]
    return [{'pid': int(p), 'args': a} for p, st, *rest in rows for a in [rest[0] if rest else '']
            if int(p) != os.getpid() and not st.startswith('Z') and not a.startswith('ps ')]
