/-
ei-replay: re-check through Lean's kernel every declaration one proof added to its environment.

Written for ei_nb (issue 28, part 3) against Lean v4.9.0-rc1; NOT compiled where it was written (no Lean there):
`ei setup-lean` builds it beside the REPL, at the REPL's toolchain. The route is lean4checker's
(leanprover/lean4checker, tag v4.9.0 = b3178065, `Main.lean` `replayFromImports`): import the environment the
proof started from, then `Environment.replay` (core `Lean.Replay`) the constants the proof added, which sends every
one of them to the kernel again and regenerates constructors and recursors of inductive types; `unsafe` and
`partial` constants are skipped (a theorem that uses one then fails: its constant is unknown to the kernel).
SafeVerify (GasStationManager/SafeVerify, branch minif2f-deepseek-check 0c0f7dcf, toolchain v4.9.0) reads axioms
and types from the REPLAYED environment the same way; so does this tool, so a forged environment cannot tamper
with them.

Input: the constants a proof added, as either
* a REPL pickle: `{"pickleTo": PATH, "env": N}` of leanprover-community/repl at v4.9.0-rc1 writes, with
  `saveModuleData`, the tuple (imports, `constants.map₂`, command state, command context)
  (REPL/Snapshots.lean `CommandSnapshot.pickle`); only the first two are read here;
* a module's `.olean` (`lean -o`): its `ModuleData` (imports, constant names, constants).

Protocol (the REPL's framing): one JSON object per request, requests separated by a blank line; one JSON object
per reply, then a blank line, flushed.
  request: {"pickle": PATH, "name": "NAME", "imports": ["Init", "Mathlib", "Aesop"],
            "reference": "<the header's commands but imports, then the problem's statement closed by sorry>"}
           (or "olean": PATH; "reference" optional)
  reply:   {"ok": true, "replayed": K, "axioms": ["propext", ...], "type": "<Expr.dbgToString of NAME's type>",
            "statement": "same" | "differs" | "unchecked" | "no_reference" (the reference did not elaborate),
            "reference_type": "<… of the reference's type>"}
        |  {"ok": false, "reason": "..."}        the proof's fault (or a kernel-bug guard): the verdict is `fail`
        |  {"error": "..."}                      this tool's fault (unreadable file, import failed): exit 3 upstream

Issue 36: the verdict comes from this process alone. It reads no message Lean or the candidate wrote: the axioms
are collected in the replayed environment, and the statement's type is compared here with the reference statement
elaborated in this process from the header's imports alone (`Lean.Elab.IO.processCommands` on the reference text,
`src/Lean/Elab/Frontend.lean`; the comparison is `Expr` equality, as SafeVerify's `checkTheorem` compares
`ConstantInfo.type`s, GasStationManager/SafeVerify 0c0f7dcf `Main.lean`).
Kernel-bug guards (the pinned v4.9.0-rc1 kernel; the table is in nbs/verifier/policy.ipynb), checked on every added
constant before the replay:
* only theorems and definitions: no inductive type, constructor, recursor, quotient, opaque or axiom (the proofs of
  `False` of lean4#14576/#14577, #14613, #14806/#14807 all declare their own inductive types or structures);
* no free or meta variable, or loose bound variable, in a type or value (lean4#14484/#14498: an `opaque` whose value
  holds an fvar of a seeded cache);
* every `Expr.proj S i _` names a structure-like inductive type of the header's environment with i < its fields
  (lean4#14576: a projection whose structure does not match);
* no `Nat.pow c e` with `c` a constant and `e` a literal, and no literal exponent of 2^24 or more (lean4#8060:
  `reduce_pow` read a constant base as a GMP number; lean4#15022: the exponent 2^31 hung `mpz::pow`).
-/
import Lean
import Lean.Replay

open Lean

namespace EiReplay

/-- The object `REPL.CommandSnapshot.pickle` saves: `(imports, constants.map₂, rest)`. The rest (the command state
and context) is held, never read: `NonScalar` stands for any boxed object. -/
abbrev Pickled := Array Import × PHashMap Name ConstantInfo × NonScalar

/-- What a proof added to its environment, and the imports that environment started from. -/
structure Added where
  imports : Array Import
  constants : HashMap Name ConstantInfo

/-- The compacted regions read here are never freed: a tool process serves a bounded number of requests
(the client recycles it) and the constants replayed point into them. -/
unsafe def readPickle (path : System.FilePath) : IO Added := do
  let (data, _) ← readModuleData path
  let p : Pickled := unsafeCast data
  return { imports := p.1, constants := HashMap.ofList p.2.1.toList }

unsafe def readOlean (path : System.FilePath) : IO Added := do
  let (mod, _) ← readModuleData path
  let mut constants : HashMap Name ConstantInfo := {}
  for n in mod.constNames, ci in mod.constants do
    constants := constants.insert n ci
  return { imports := mod.imports, constants }

/-- The header's environment, imported once per tool process and reused: `Environment` is a value, and each
replay starts from the same one. -/
structure Base where
  imports : Array Name
  env : Environment

def importNames (imports : Array Import) : Array Name := imports.map (·.module)

def baseFor (cache : IO.Ref (Option Base)) (imports : Array Import) : IO Environment := do
  let names := importNames imports
  if let some b ← cache.get then
    if b.imports == names then return b.env
  let env ← importModules imports {} 0
  cache.set (some { imports := names, env })
  return env

/-- The constants `ci` refers to, followed the way `#print axioms` follows them: the type, the value of a
definition, theorem or opaque constant, the constructors of an inductive type. (Written here rather than calling
core's `CollectAxioms`, whose namespace moved between Lean versions.) -/
def refs (ci : ConstantInfo) : List Name :=
  let ofE (e : Expr) : List Name := e.getUsedConstants.toList
  match ci with
  | .defnInfo v => ofE v.type ++ ofE v.value
  | .thmInfo v => ofE v.type ++ ofE v.value
  | .opaqueInfo v => ofE v.type ++ ofE v.value
  | .inductInfo v => ofE v.type ++ v.ctors
  | other => ofE other.type

partial def axiomsFrom (env : Environment) : List Name → NameSet → Array Name → Array Name
  | [], _, out => out
  | n :: rest, seen, out =>
    if seen.contains n then axiomsFrom env rest seen out
    else match env.find? n with
      | some (.axiomInfo _) => axiomsFrom env rest (seen.insert n) (out.push n)
      | some ci => axiomsFrom env (refs ci ++ rest) (seen.insert n) out
      | none => axiomsFrom env rest (seen.insert n) out

/-- The axioms `NAME` depends on in `env` (the replayed environment). -/
def axiomsOf (env : Environment) (n : Name) : Array Name := axiomsFrom env [n] {} #[]

def failed (why : String) : Json := Json.mkObj [("ok", toJson false), ("reason", toJson why)]

/-- A constant (not a numeral) as the base of `Nat.pow`: the shape lean4#8060's kernel read as a literal. -/
def isConstBase : Expr → Bool
  | .const _ _ => true
  | .mdata _ e => isConstBase e
  | _ => false

def literalValue : Expr → Option Nat
  | .lit (.natVal n) => some n
  | .mdata _ e => literalValue e
  | e => if e.isAppOfArity ``OfNat.ofNat 3 then literalValue (e.getArg! 1) else none

/-- The first subterm of `e` that a guard refuses, described. -/
def badSubterm (base : Environment) (e : Expr) : Option String :=
  let hit := e.find? fun x =>
    (x.isAppOfArity ``Nat.pow 2 && (isConstBase (x.getArg! 0) && (literalValue (x.getArg! 1)).isSome
        || (literalValue (x.getArg! 1)).any (· ≥ 2 ^ 24)))
    || (match x with
        | .proj s i _ => match getStructureLikeNumFields base s with
          | 0 => true
          | n => i ≥ n
        | _ => false)
  hit.map fun
    | .proj s _ _ => s!"a projection of {s}, not a field of a structure of the header (lean4#14576)"
    | _ => "Nat.pow on a constant base, or a huge exponent (lean4#8060, #15022)"

/-- The kernel-bug guards (see the module doc) on one added constant: `none` when it passes. -/
def guard (base : Environment) (ci : ConstantInfo) : Option String :=
  let kind := match ci with
    | .thmInfo _ | .defnInfo _ => none
    | _ => some s!"{ci.name} declares an inductive type, constructor, recursor, opaque, quotient or axiom"
  let exprs := ci.type :: (match ci.value? with | some v => [v] | none => [])
  if kind.isSome then kind
  else if exprs.any (fun e => e.hasFVar || e.hasMVar || e.hasLooseBVars) then
    some s!"{ci.name} holds a free, meta or loose bound variable (lean4#14484)"
  else (exprs.findSome? (badSubterm base)).map (s!"{ci.name}: " ++ ·)

/-- The type of the reference statement elaborated from the header's imports alone, in this process. -/
def referenceType (base : Environment) (name : Name) (text : String) : IO (Option Expr) := do
  let inputCtx := Parser.mkInputContext text "<reference>"
  let s ← Elab.IO.processCommands inputCtx {} (Elab.Command.mkState base {} {})
  return (s.commandState.env.find? name).map (·.type)

/-- Check the proof's added constants before any replay: the same imports as the header, NAME added, a theorem. -/
def precheck (added : Added) (name : Name) (want : Array String) : Option String :=
  let got := (importNames added.imports).map toString
  if got != want then some s!"the proof's environment imports {got}, the header {want}" else
  match added.constants.find? name with
  | some (.thmInfo _) => none
  | some _ => some s!"{name} is not a theorem among the declarations the proof added"
  | none => some s!"{name} is not among the declarations the proof added"

unsafe def answer (cache : IO.Ref (Option Base)) (j : Json) : IO Json := do
  let name := (← IO.ofExcept (j.getObjValAs? String "name")).toName
  let want ← IO.ofExcept (j.getObjValAs? (Array String) "imports")
  let added ← match (j.getObjValAs? String "pickle").toOption, (j.getObjValAs? String "olean").toOption with
    | some p, _ => readPickle ⟨p⟩
    | none, some o => readOlean ⟨o⟩
    | none, none => throw <| IO.userError "the request names neither a pickle nor an olean"
  if let some why := precheck added name want then return failed why
  let base ← baseFor cache added.imports
  if let some why := added.constants.toList.findSome? (fun (_, ci) => guard base ci) then
    return failed s!"kernel-bug guard: {why}"
  match ← EIO.toBaseIO (base.replay added.constants) with
  | .error e => return failed (toString e)
  | .ok env =>
    let some ci := env.find? name | return failed s!"{name} is missing after the replay"
    let ref ← match (j.getObjValAs? String "reference").toOption with
      | some text => referenceType base name text
      | none => pure none
    let statement := match ref with
      | none => if (j.getObjValAs? String "reference").isOk then "no_reference" else "unchecked"
      | some t => if t == ci.type then "same" else "differs"
    return Json.mkObj [("ok", toJson true), ("replayed", toJson added.constants.size),
      ("axioms", toJson ((axiomsOf env name).map toString)), ("type", toJson ci.type.dbgToString),
      ("statement", toJson statement), ("reference_type", toJson ((ref.map (·.dbgToString)).getD ""))]

/-- The next request: lines up to a blank line (blank lines before it skipped); "" at the end of the input. -/
partial def readRequest (stdin : IO.FS.Stream) (acc : String := "") : IO String := do
  let line ← stdin.getLine
  if line.isEmpty then return acc
  if line.trim.isEmpty then
    if acc.trim.isEmpty then readRequest stdin "" else return acc
  else readRequest stdin (acc ++ line)

unsafe def serve (stdin stdout : IO.FS.Stream) (cache : IO.Ref (Option Base)) : IO Unit := do
  let request ← readRequest stdin
  if request.trim.isEmpty then return
  let reply ← match Json.parse request with
    | .error e => pure (Json.mkObj [("error", toJson s!"not JSON: {e}")])
    | .ok j => do
      match ← EIO.toBaseIO (answer cache j) with
      | .ok r => pure r
      | .error e => pure (Json.mkObj [("error", toJson (toString e))])
  stdout.putStr (reply.compress ++ "\n\n")
  stdout.flush
  serve stdin stdout cache

end EiReplay

unsafe def main (_ : List String) : IO UInt32 := do
  initSearchPath (← findSysroot)
  let cache ← IO.mkRef none
  EiReplay.serve (← IO.getStdin) (← IO.getStdout) cache
  return 0
