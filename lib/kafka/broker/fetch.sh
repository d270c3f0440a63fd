#!/usr/bin/env bash
# Downloads the Apache Kafka broker pinned in pom.xml (and its runtime dependencies) from Maven Central into a
# cache outside git, once, and prints the directory that holds the jars.
#
#   cache: ${RXRL_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-kafka}/<kafka version>/libs
#
# Used by lib/kafka/broker.ts (tests, examples) and by scripts/test-setup.sh (to fetch before the tests start, into
# .cache/kafka).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=mavenCache.sh
. "$here/mavenCache.sh"
maven_cache "the Kafka broker" "$here/pom.xml" kafka.version "${RXRL_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-kafka}" libs \
  'ls kafka_2.13-*.jar >/dev/null' -- dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=@OUT@
