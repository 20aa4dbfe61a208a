"""The page's settings, one row each: what the sidebar shows (label, widget, help, where), how a
widget's value is read back, the lab's bounds, and the engine field it becomes
(``EngineConfig`` or ``SamplingParams``, app/engine_build.py) with the label messages use.
``Settings`` is made from the rows, so a new setting is one row here.

Nothing here imports Streamlit: app/views/settings_form.py draws the rows."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from engine.sched.registry import semantics_of
from paged_kernels.dispatch import BACKENDS

MAX_POOL_BLOCKS = 1024   # keeps one session's KV pool small
OMIT = object()          # an engine value of OMIT leaves the engine's own default


def _beams(s) -> bool:
    # the beam settings are refused without beams, and the sampling ones with them; the
    # sidebar keeps both
    return s.beam_width > 1


@dataclass(frozen=True)
class Setting:
    name: str                        # the Settings field; the widget's key is w_<name>
    label: str                       # the widget's label (tests click it)
    widget: str                      # number, text_area, radio, checkbox, selectbox, model
    default: object
    # where the sidebar puts it: the form, its two columns ("left", "right") or an expander
    place: str = "form"
    help: str | Callable[[object], str] | None = None   # a callable gets the engine's rules
    disabled: Callable[[object], bool] | None = None    # given the engine's rules
    options: tuple = ()              # radio / selectbox choices
    step: float | None = None
    format: str | None = None
    height: int | None = None
    integer: bool = False            # a number widget returns floats: 3.0 is read as 3
    zero_is_none: bool = False       # 0 or an empty field: None (the engine's default)
    at_most: int | None = None       # the lab's bound (refused with ``too_big``)
    too_big: str = ""
    target: str = "config"           # "config" (EngineConfig) or "params" (SamplingParams)
    # the engine's value from the settings (default: the field's value); OMIT: not passed
    to_engine: Callable[[object, object], object] | None = None
    message_label: str | None = None  # names the engine's field in messages (None: as is)

    def help_for(self, rules) -> str | None:
        return self.help(rules) if callable(self.help) else self.help

    def engine_value(self, s):
        value = getattr(s, self.name)
        return self.to_engine(value, s) if self.to_engine is not None else value

    def read(self, value):
        """The widget's value as the setting holds it."""
        if self.integer and isinstance(value, float) and value.is_integer():
            value = int(value)
        if self.zero_is_none and value in (0, None):
            value = None
        return value


_POOLS_TOO_BIG = f"pool sizes are limited to {MAX_POOL_BLOCKS} blocks in the lab"

# in the sidebar's order
SETTINGS: tuple[Setting, ...] = (
    Setting("model", "Model", "model", "default"),
    Setting("prompts", "Prompts (one request per line)", "text_area", "ROMEO:", height=110,
            target="prompts"),
    Setting("n", "n (samples)", "number", 1, "left", step=1, integer=True, target="params"),
    Setting("beam_width", "beam width", "number", 1, "right", step=1, integer=True,
            target="params", message_label="beam width",
            help="> 1 = beam search: transformers' scoring, vLLM v0's memory rules "
                 "(survivors fork, pruned beams free blocks); needs temperature 0"),
    Setting("temperature", "temperature", "number", 0.0, "left", step=0.1, format="%.2f",
            target="params"),
    Setting("max_tokens", "max tokens", "number", 16, "right", step=1, integer=True,
            target="params", message_label="max tokens"),
    Setting("block_size", "block size", "number", 8, "left", step=1, integer=True,
            message_label="block size", help="tokens per KV block: a power of two"),
    Setting("seed", "seed", "number", 0, "right", step=1, integer=True),
    Setting("num_gpu_blocks", "GPU pool (blocks)", "number", 32, "left", step=1, integer=True,
            at_most=MAX_POOL_BLOCKS, too_big=_POOLS_TOO_BIG,
            message_label="GPU pool (blocks)"),
    Setting("num_cpu_blocks", "CPU pool (blocks)", "number", 0, "right", step=1, integer=True,
            at_most=MAX_POOL_BLOCKS, too_big=_POOLS_TOO_BIG,
            message_label="CPU pool (blocks)", help="swap space; 0 disables swapping"),
    # None = the model's context; presets pick a visible slab
    Setting("max_model_len", "max_model_len (slots per sequence)", "number", None, step=1,
            integer=True, zero_is_none=True,
            help="the slab a contiguous allocator reserves for every sequence: the longest "
                 "prompt + output a sequence may reach (vLLM's max_model_len). 0 = the "
                 "model's context."),
    Setting("preemption_mode", "Preemption", "radio", "recompute",
            options=("recompute", "swap"), message_label="Preemption",
            disabled=lambda rules: not rules.has_swap,
            help=lambda rules: "what happens to a preempted sequence's blocks" if rules.has_swap
            else f"{rules.label} preempts by recompute only (it has no swap)"),
    Setting("enable_prefix_caching", "Prefix caching", "checkbox", False,
            message_label="Prefix caching", help="on by default in vLLM v1, off in v0"),
    # the step's token budget is the page's to choose only where prefills are chunked (v1);
    # elsewhere EngineConfig's large default stays (v0: whole prompts in one prefill step).
    # Small in the presets so chunked prefill shows.
    Setting("max_num_batched_tokens", "token budget per step (v1)", "number", 16, step=1,
            integer=True, message_label="token budget per step (v1)",
            disabled=lambda rules: not rules.chunks_prefills,
            to_engine=lambda v, s: v if semantics_of(s.semantics).chunks_prefills else OMIT,
            help="vLLM v1's max_num_batched_tokens: the tokens one step may compute; a "
                 "longer prompt is computed in chunks (chunked prefill). v0 computes whole "
                 "prompts in a prefill step."),
    Setting("top_p", "top-p", "number", 1.0, "More sampling settings", step=0.05,
            format="%.2f", target="params", message_label="top-p",
            to_engine=lambda v, s: 1.0 if _beams(s) else v,
            help="sampling only: beam search ranks every token, so with beam width > 1 it is "
                 "not used"),
    Setting("top_k", "top-k (-1 = off)", "number", -1, "More sampling settings", step=1,
            integer=True, target="params", message_label="top-k",
            to_engine=lambda v, s: -1 if _beams(s) else v,
            help="sampling only: not used with beam width > 1"),
    Setting("length_penalty", "length penalty (beams)", "number", 1.0,
            "More sampling settings", step=0.1, format="%.2f", target="params",
            message_label="length penalty (beams)",
            to_engine=lambda v, s: v if _beams(s) else 1.0,
            help="beam search only: not used with beam width 1"),
    # presets run to max_tokens so their point always shows
    Setting("ignore_eos", "ignore EOS (always run to max tokens)", "checkbox", True,
            "More sampling settings", target="params", message_label="ignore EOS"),
    Setting("backend", "Kernel backend", "selectbox", "auto", "Kernels",
            options=("auto", *BACKENDS),
            help="auto: Triton kernels on a CUDA GPU (an op whose kernel fails to compile or "
                 "launch falls back to torch, and the page says so), torch on CPU; the others "
                 "force one. On CPU, Triton needs TRITON_INTERPRET=1 set before the server "
                 "starts."),
)
BY_NAME = {row.name: row for row in SETTINGS}


def _replace(self, **changes):
    return dataclasses.replace(self, **changes)


# Everything the sidebar edits, and which engine runs it: ``scenario`` (the preset),
# ``semantics`` (which vLLM engine's rules, a registry name) and ``real_vllm`` (run the real
# vLLM, with our engine of its rules beside it). app/engine_build.py turns it into an engine.
Settings = dataclasses.make_dataclass(
    "Settings",
    [("scenario", str, dataclasses.field(default="single")),
     ("semantics", str, dataclasses.field(default="v0")),
     *((row.name, object, dataclasses.field(default=row.default)) for row in SETTINGS),
     ("real_vllm", bool, dataclasses.field(default=False))],
    frozen=True, namespace={"replace": _replace})
Settings.__module__ = __name__          # pickles and reprs name this module
