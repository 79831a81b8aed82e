"""The command lines of `tritonstack`, one module per sub-command: `<name>.py` holds its
parser and `main(argv) -> int`, and nothing else of substance; the work lives in the
package's rooms (build/, serve/, client/) and tools (benchmark/, experiments/, gpu/,
diagnostics/, loadtests/) and the engine they share (measure/). tritonstack/__main__.py
imports a command's module only when it runs, so a client-only install never loads the
server stack."""
