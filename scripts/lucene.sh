#!/usr/bin/env bash
# Fetches the Lucene anchor's jars (scripts/bench/LuceneAnchor.java) from Maven Central into
# $KART_LUCENE_JARS (default ~/.cache/kart/lucene), checking each against its pinned SHA-256.
# Idempotent: jars already there and intact are kept. Prints the folder.
#
# Lucene 9.12 is the newest line that runs on Java 17 (Debian 12's JDK; Lucene 10 needs Java 21);
# pyserini's Anserini runs Lucene 9.
set -euo pipefail
dir="${KART_LUCENE_JARS:-$HOME/.cache/kart/lucene}"
central="https://repo1.maven.org/maven2"
jars=(
  "org/apache/lucene/lucene-core/9.12.3/lucene-core-9.12.3.jar b64a3f8098a7572034fb30085cdee01b34ec81fb0e5a31b471536af58dc6c01b"
  "org/apache/lucene/lucene-analysis-common/9.12.3/lucene-analysis-common-9.12.3.jar fa571bd7caf0f0b4faf46a72ca004a7836f348c31d92bd522dddcc3d128d287e"
  "com/fasterxml/jackson/core/jackson-core/2.18.2/jackson-core-2.18.2.jar d8054ae7c0d1c2d2f55d28e46026ebe5892881f3fab5f439233184381c3b4a1f"
)
mkdir -p "$dir"
for entry in "${jars[@]}"; do
  read -r path sha <<<"$entry"
  file="$dir/$(basename "$path")"
  if [ -f "$file" ] && echo "$sha  $file" | sha256sum --check --status; then
    continue
  fi
  echo "lucene: fetching $(basename "$path")" >&2
  for attempt in 1 2 3; do
    if curl -fsSL --retry 3 -o "$file.part" "$central/$path" && echo "$sha  $file.part" | sha256sum --check --status; then
      mv "$file.part" "$file"
      break
    fi
    rm -f "$file.part"
    [ "$attempt" -lt 3 ] || { echo "lucene: could not fetch $central/$path with SHA-256 $sha" >&2; exit 1; }
  done
done
echo "$dir"
