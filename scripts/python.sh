# Sourced by the setup scripts: sets PYTHON to the interpreter a new venv is made with.
# $PYTHON when set; else the first of python3.12, python3.13 (the Pythons of ESPnet 202611) and
# python3.11 that runs (a pyenv install that is not the selected version counts too); else python3.
# requires-python in pyproject.toml is >=3.11,<3.14: CI runs the suite on 3.12, the lowest-versions
# tier on 3.11.
pick_python() {  # pick_python [VERSION...] (default: 3.12 3.13 3.11)
  local version candidate root
  [ $# -gt 0 ] || set -- 3.12 3.13 3.11
  for version in "$@"; do
    if "python$version" -c "" >/dev/null 2>&1; then echo "python$version"; return; fi
    root=$(pyenv root 2>/dev/null) || continue
    for candidate in "$root"/versions/"$version".*/bin/"python$version"; do
      if [ -x "$candidate" ] && "$candidate" -c "" >/dev/null 2>&1; then echo "$candidate"; return; fi
    done
  done
  echo python3
}
PYTHON=${PYTHON:-$(pick_python)}

# An editable install writes build/ and *.egg-info into this checkout, and CI runs set-ups side by
# side (.ci/run): each pip install -e of the project holds this checkout's lock (flock, util-linux;
# where flock is missing, none).
editable_install() {  # editable_install CMD...: run CMD holding .e3p-install.lock
  if command -v flock >/dev/null 2>&1; then flock .e3p-install.lock "$@"; else "$@"; fi
}
