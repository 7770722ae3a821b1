"""Architecture facts launchers need: the decoder-layer class FSDP wraps, per model_type.

The class names are those of Hugging Face transformers' modeling files (``modeling_<type>.py``);
a test checks each one exists in the installed transformers.
"""

from __future__ import annotations

from trainledger.errors import SpecError

DECODER_LAYER_CLASS: dict[str, str] = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen2_moe": "Qwen2MoeDecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer",
    "gemma3": "Gemma3DecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer",
    "olmo2": "Olmo2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
}


def decoder_layer_class(model_type: str) -> str:
    """The transformer block class FSDP auto-wraps for this architecture."""
    try:
        return DECODER_LAYER_CLASS[model_type]
    except KeyError:
        raise SpecError(
            f"no known decoder-layer class for model_type {model_type!r} (generic specs have no "
            f"transformers implementation); set fsdp_transformer_layer_cls_to_wrap by hand"
        ) from None
