"""Package metadata is read from settings.ini (the nbdev convention)."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

requirements = cfg.get('requirements', '').split()
dev_requirements = cfg.get('dev_requirements', '').split()

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    author=cfg['author'],
    author_email=cfg['author_email'],
    license='Apache-2.0',
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=['ei_nb', 'ei_nb.*']),
    include_package_data=True,
    package_data={'ei_nb': ['kernels/*.c', 'lean/*.lean', 'lean/lean-toolchain']},   # the kernels' C sources (averaging, JSON Lines scanning), compiled on first use; the replay tool's Lean sources, built by ei setup-lean
    python_requires='>=' + cfg['min_python'],
    install_requires=requirements,
    extras_require={
        'dev': dev_requirements,
        # vLLM pins its own CUDA torch: install it on GPU nodes only.
        'vllm': ['vllm>=0.11'],
        'sft': ['accelerate>=1.0'],
        # `ei pool` reads hub ids and dataset folders with it (local .jsonl/.parquet files need nothing more).
        'pool': ['datasets>=2.18'],
        # verify.backend = "ray": Lean checking on a Ray cluster's nodes (ei_nb.lean_ray); every node needs it.
        'ray': ['ray>=2.40'],
    },
    entry_points={'console_scripts': cfg['console_scripts'].split(),
                  'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    keywords=cfg['keywords'].split(),
    classifiers=['Programming Language :: Python :: 3.11', 'License :: OSI Approved :: Apache Software License'],
    project_urls={'Source': cfg['git_url']},
    zip_safe=False,
)
