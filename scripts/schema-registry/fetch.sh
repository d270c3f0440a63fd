#!/usr/bin/env bash
# Downloads the Apicurio Registry pinned in pom.xml (its built "all" archive) from Maven Central into a cache outside
# git, once, unpacks it, and prints the directory that holds its runner jar.
#
#   cache: ${RXRL_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-registry}/<apicurio version>/app
#
# Used by scripts/test-setup.sh (into .cache/registry) and by spec/helpers/schemaRegistry.ts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$here/pom.xml")"
if [ -z "$version" ]; then
  echo "fetch.sh: no <apicurio.version> in $here/pom.xml" >&2
  exit 1
fi
cache="${RXRL_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-registry}/$version"
mkdir -p "$cache"
if [ ! -f "$cache/.complete" ]; then
  for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "fetch.sh: '$tool' is required to fetch the schema registry (Java 17+ and Maven 3)" >&2
      exit 1
    fi
  done
  # One fetch at a time, even when several processes start registries at once.
  exec 9>"$cache/.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if [ ! -f "$cache/.complete" ]; then
    tmp="$(mktemp -d "$cache/.app.XXXXXX")"
    echo "fetch.sh: fetching io.apicurio:apicurio-registry-app:$version (all.tar.gz) into $cache" >&2
    mvn -B -q -Dstyle.color=never -f "$here/pom.xml" dependency:unpack -Dregistry.dir="$tmp" >&2
    if ! ls "$tmp"/*-runner.jar >/dev/null 2>&1; then
      echo "fetch.sh: no runner jar in apicurio-registry-app-$version-all.tar.gz" >&2
      rm -rf "$tmp" "$tmp.markers"
      exit 1
    fi
    rm -rf "$cache/app" "$tmp.markers"
    mv "$tmp" "$cache/app"
    touch "$cache/.complete"
  fi
fi
echo "$cache/app"
