# Sourced by the fetch scripts of the Kafka broker (lib/kafka/broker/fetch.sh) and of the specs' schema registry
# (scripts/schema-registry/fetch.sh): what Maven fetches from Maven Central goes into a cache outside git, once.
#
#   maven_cache WHAT POM VERSION_TAG CACHE SUBDIR CHECK -- MAVEN_ARGS...
#
# reads <VERSION_TAG> from POM, and unless CACHE/<version>/.complete exists, runs `mvn -f POM MAVEN_ARGS` with each
# `@OUT@` in them replaced by a fresh directory (one run at a time, under a lock), checks that directory with the
# shell command CHECK (run inside it), moves it to CACHE/<version>/SUBDIR and marks it complete. Prints
# CACHE/<version>/SUBDIR.
maven_cache() {
  local what="$1" pom="$2" tag="$3" root="$4" subdir="$5" check="$6"
  shift 7
  local version cache
  version="$(sed -n "s:.*<$tag>\(.*\)</$tag>.*:\1:p" "$pom")"
  if [ -z "$version" ]; then
    echo "fetch.sh: no <$tag> in $pom" >&2
    return 1
  fi
  cache="$root/$version"
  mkdir -p "$cache"
  if [ ! -f "$cache/.complete" ]; then
    for tool in java mvn; do
      if ! command -v "$tool" >/dev/null 2>&1; then
        echo "fetch.sh: '$tool' is required to fetch $what (Java 17+ and Maven 3)" >&2
        return 1
      fi
    done
    # One fetch at a time, even when several processes start at once.
    exec 9>"$cache/.lock"
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    if [ ! -f "$cache/.complete" ]; then
      local out
      out="$(mktemp -d "$cache/.$subdir.XXXXXX")"
      echo "fetch.sh: fetching $what $version into $cache" >&2
      mvn -B -q -Dstyle.color=never -f "$pom" "${@//@OUT@/$out}" >&2
      if ! (cd "$out" && eval "$check"); then
        echo "fetch.sh: $what $version: what Maven fetched fails the check '$check'" >&2
        rm -rf "$out" "$out.markers"
        return 1
      fi
      rm -rf "${cache:?}/$subdir" "$out.markers"
      mv "$out" "$cache/$subdir"
      touch "$cache/.complete"
    fi
  fi
  echo "$cache/$subdir"
}
