#!/usr/bin/env bash
# Downloads the Apicurio Registry pinned in pom.xml (its built "all" archive) from Maven Central into a cache outside
# git, once, unpacks it, and prints the directory that holds its runner jar.
#
#   cache: ${RXRL_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-registry}/<apicurio version>/app
#
# Used by scripts/test-setup.sh (into .cache/registry) and by spec/helpers/schemaRegistry.ts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../lib/kafka/broker/mavenCache.sh
. "$here/../../lib/kafka/broker/mavenCache.sh"
maven_cache "the schema registry (io.apicurio:apicurio-registry-app, all.tar.gz)" "$here/pom.xml" apicurio.version \
  "${RXRL_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-registry}" app 'ls ./*-runner.jar >/dev/null' \
  -- dependency:unpack -Dregistry.dir=@OUT@
