# Sourced by run_long.sh and run_fork.sh: fuzz_max_len TARGET prints the -max_len for a
# long run of TARGET: what its input needs, not more, since an execution's cost grows with
# the input (docs/RELIABILITY.md, "Session 10: faster targets"). model_gguf: its seeds are
# 38-85 KB models; quants: 8 K-quant super-blocks of floats and a type byte; the other
# harnesses cap their input themselves at or above these.
fuzz_max_len() {
  case $1 in
    fuzz_model_gguf | fuzz_gguf | fuzz_safetensors) echo 262144 ;;
    fuzz_template | fuzz_oai) echo 65536 ;;
    fuzz_hf_tokenizer) echo 32768 ;;
    fuzz_chat_json | fuzz_perfdb | fuzz_serve_tenants) echo 16384 ;;
    fuzz_quants) echo 8193 ;;
    fuzz_tokenizer | fuzz_cli_args) echo 4096 ;;
    *) echo 65536 ;;
  esac
}
