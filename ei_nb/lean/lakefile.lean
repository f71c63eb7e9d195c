import Lake
open Lake DSL

-- ei-replay: the kernel replay of what one proof added (ei_nb, issue 28). Built by `ei setup-lean` at the
-- REPL's toolchain (lean-toolchain beside this file), run as `lake env <this package>/.lake/build/bin/ei-replay`
-- inside the Mathlib project, so that `importModules` finds the header's modules.
package «ei-replay» where

@[default_target]
lean_exe «ei-replay» where
  root := `EiReplay
