# SPDX-License-Identifier: MIT
# Writes rope-reference.json: inv_freq (float32 bits) and attention_factor from
# transformers' rope init functions, for test-rope. Run where torch and transformers exist:
#   python3 rope-reference.py > rope-reference.json
import json, struct, sys
import torch, transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
print("transformers", transformers.__version__, file=sys.stderr)
cases = [
  ("llama3", dict(hidden_size=4096, num_attention_heads=32, head_dim=128, max_position_embeddings=131072,
     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
  ("yarn", dict(hidden_size=2048, num_attention_heads=16, head_dim=128, max_position_embeddings=131072,
     rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                      "original_max_position_embeddings": 32768})),
  ("yarn64", dict(hidden_size=2048, num_attention_heads=32, head_dim=64, max_position_embeddings=163840,
     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 4096})),
  ("default", dict(hidden_size=512, num_attention_heads=4, head_dim=128, max_position_embeddings=4096,
     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
]
out = {}
for name, kw in cases:
    cfg = LlamaConfig(**kw)
    rt = kw["rope_parameters"]["rope_type"]
    fn = ROPE_INIT_FUNCTIONS.get(rt) if rt != "default" else None
    if fn is None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        inv, att = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg, "cpu")
    else:
        inv, att = fn(cfg, "cpu")
    bits = [struct.unpack("<I", struct.pack("<f", float(x)))[0] for x in inv.float().tolist()]
    out[name] = {"inv_freq_bits": bits, "attention_factor": float(att)}
json.dump(out, sys.stdout)
