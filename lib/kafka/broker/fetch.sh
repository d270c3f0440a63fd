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
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
if [ -z "$version" ]; then
  echo "fetch.sh: no <kafka.version> in $here/pom.xml" >&2
  exit 1
fi
cache="${RXRL_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxrl-kafka}/$version"
mkdir -p "$cache"
if [ ! -f "$cache/.complete" ]; then
  for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "fetch.sh: '$tool' is required to fetch the Kafka broker (Java 17+ and Maven 3)" >&2
      exit 1
    fi
  done
  # One fetch at a time, even when several processes start brokers at once.
  exec 9>"$cache/.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if [ ! -f "$cache/.complete" ]; then
    tmp="$(mktemp -d "$cache/.libs.XXXXXX")"
    echo "fetch.sh: fetching org.apache.kafka:kafka_2.13:$version into $cache" >&2
    mvn -B -q -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$tmp" >&2
    rm -rf "$cache/libs"
    mv "$tmp" "$cache/libs"
    touch "$cache/.complete"
  fi
fi
echo "$cache/libs"
