#!/usr/bin/env bash
# Regenerates the seed corpus of ipc_session_fuzzer with the stock capnp tool:
# each seed is a client's byte stream, one or more Request messages.
# The group-publish seeds (group_*), whose real encoded layers the capnp tool
# cannot make, come from ipc_make_group_seeds (make_ipc_group_seeds.cc).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=tests/fuzz/corpus/ipc_session_fuzzer
schema=ipc/primecache.capnp
mkdir -p "$out"
enc() { capnp encode "$schema" Request <<<"$1"; }
hello='(id = 1, hello = (minVersion = 1, maxVersion = 1, client = "seed", namespace = "t"))'
fp='fingerprint = (digestLo = 1, digestHi = 2, name = "m")'
seed() { local name=$1; shift; : >"$out/$name"; for m in "$@"; do enc "$m" >>"$out/$name"; done; }
seed hello "$hello"
seed lookup "$hello" "(id = 2, lookup = (query = ($fp, namespace = \"t\", tokens = [1, 2, 3, 4])))"
seed publish "$hello" \
  "(id = 2, publishBegin = (boundary = ($fp, namespace = \"t\", tokens = [1, 2, 3], length = 3), layerCount = 1))" \
  "(id = 3, publishLayer = (publish = 2, layer = 0, header = 0x\"0102030405\", chunkCount = 2))" \
  "(id = 4, publishChunk = (publish = 2, layer = 0, index = 0, data = (inline = 0x\"00112233\")))" \
  "(id = 5, publishChunk = (publish = 2, layer = 0, index = 1, data = (shm = (offset = 0, length = 8))))" \
  "(id = 6, publishCommit = (publish = 2))"
seed publish_abort "$hello" \
  "(id = 2, publishBegin = (boundary = ($fp, tokens = [9], length = 1), layerCount = 2))" \
  "(id = 3, publishAbort = (publish = 2))"
seed fetch "$hello" "(id = 2, fetch = (entry = 1, layers = [0, 1]))" "(id = 3, cancel = (target = 2))" \
  "(id = 4, fetch = (entry = 1, shmWindow = (offset = 0, length = 4096)))"
seed admin "$hello" "(id = 2, list = (pageSize = 5, allNamespaces = true))" "(id = 3, stat = void)" \
  "(id = 4, verify = (entry = 1))" "(id = 5, delete = (entry = 1))" "(id = 6, setCapacity = (bytes = 1000000))"
seed inspect "$hello" "(id = 2, describe = (entry = 1, layerHeaders = true))" \
  "(id = 3, list = (pageSize = 10, allNamespaces = true, quarantined = true))" \
  "(id = 4, verifyStore = (readChunks = true))" "(id = 5, compact = void)"
seed publish_descriptor "$hello" \
  "(id = 2, publishBegin = (boundary = (fingerprint = (digestLo = 1, digestHi = 2, name = \"m\", descriptor = 0x\"70726963\"), namespace = \"t\", tokens = [5, 6], length = 2), layerCount = 1))"
seed shm "$hello" "(id = 2, shmAttach = (size = 65536))" "(id = 0, shmRelease = (offset = 0, length = 10))"
seed no_hello "(id = 7, stat = void)" "$hello" "(id = 8, hello = (minVersion = 3, maxVersion = 9))"
echo "seeds in $out: $(ls "$out" | wc -l)"
