# Sourced by kart's scripts: the project venv, libtorch from the venv's PyTorch, and its libraries
# on the loader path, so `cargo build` and the `kart` binaries work in a fresh shell.
KART_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KART_ROOT
export KART_VENV="${KART_VENV:-$KART_ROOT/.venv}"
export VIRTUAL_ENV="$KART_VENV"
case ":$PATH:" in *":$KART_VENV/bin:"*) ;; *) export PATH="$KART_VENV/bin:$PATH" ;; esac
# torch-sys only checks that LIBTORCH_USE_PYTORCH is set, but reruns its build script when the value
# changes: naming the venv makes a target folder shared between clones relink against this clone's
# libtorch instead of a path that may be gone.
export LIBTORCH_USE_PYTORCH="$KART_VENV"
export LIBTORCH_BYPASS_VERSION_CHECK="${LIBTORCH_BYPASS_VERSION_CHECK:-0}"
if [ -x "$KART_VENV/bin/python" ]; then
  _kart_torch_lib="$("$KART_VENV/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
  if [ -n "$_kart_torch_lib" ]; then
    case ":${LD_LIBRARY_PATH:-}:" in *":$_kart_torch_lib:"*) ;; *) export LD_LIBRARY_PATH="$_kart_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
  fi
  unset _kart_torch_lib
fi
