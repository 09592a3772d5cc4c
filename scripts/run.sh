#!/usr/bin/env bash
# make run: onebitd on the shared route with embedded NATS.
#   LLAMA_SERVER=/path/to/llama-server MODEL=/path/model.gguf make run   # real llama-servers: decoder + prefill server, file route
#   make run                                                             # the bundled decoder simulator
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${STATE:-./onebitd-state}
LISTEN=${LISTEN:-127.0.0.1:8080}
mkdir -p "$STATE/slots"
if [ -n "${LLAMA_SERVER:-}" ]; then
  : "${MODEL:?set MODEL to the GGUF that llama-server should load}"
  PREFILL_SERVER=${PREFILL_SERVER:-$LLAMA_SERVER}
  echo "onebitd: launching two llama-servers with $MODEL: the decoder ($LLAMA_SERVER) and the prefill server ($PREFILL_SERVER)" >&2
  echo "onebitd: file route: the prefill server evaluates each prompt and saves the slot (bin/onebit-prefill), the decoder restores it and evaluates only the last token" >&2
  echo "  curl -s http://$LISTEN/completion -d '{\"prompt\": \"Hello\", \"n_predict\": 16}' -D - | grep -i x-onebit-route   # file" >&2
  # shellcheck disable=SC2086
  exec bin/onebitd serve --listen "$LISTEN" --state-dir "$STATE" --model "$MODEL" \
    --decoder-bin "$LLAMA_SERVER" --prefill-bin "$PREFILL_SERVER" --prefill-provider bin/onebit-prefill \
    --handoff "${HANDOFF:-always}" \
    -- -c "${CTX:-8192}" ${LLAMA_ARGS:-}
fi
MODEL=examples/sim-model.gguf
echo "onebitd: no LLAMA_SERVER given: using the bundled decoder simulator (bin/onebit-decoder-sim, a deterministic stand-in, not a language model)" >&2
echo "onebitd: shared route (--kv-share) with the sim provider; send a request with:" >&2
echo "  curl -s http://$LISTEN/completion -d '{\"prompt\": \"the cache of the decoder\", \"n_predict\": 8}' -D - " >&2
exec bin/onebitd serve --listen "$LISTEN" --state-dir "$STATE" --model "$MODEL" \
  --provider bin/onebit-provider-sim --kv-share --slots 4 --handoff "${HANDOFF:-always}" \
  --decoder-bin bin/onebit-decoder-sim -- -c 8192
