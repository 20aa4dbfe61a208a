"""Generated text per sequence with block boundaries marked (HTML, rendered by st.markdown).

Tokens are grouped by logical block; each group sits on its own grey band labelled with the
physical block it lives in, its left edge in the block's state colour of the Memory tab (blue:
owned alone, orange: shared, purple: swapped out). Prompt tokens are grey and plain; generated tokens are dark, bold and
underlined (so colour is never the only difference). Without a decode function the token ids
are shown.
"""
from __future__ import annotations

import html

from app.bidi_text import visible_bidi

from engine.core.block_math import cdiv
from app.figures.common import STATE_COLORS, block_label, token_strings

# alternating neutral tints: blue and orange are the Memory tab's "used" and "shared", so the
# band's left edge carries that state instead, in the same colours (issue 38)
_BANDS = ("#F1F3F5", "#E4E7EB")


def _text(value) -> str:
    """A trace's or a prompt's text as HTML text: escaped, bidi controls shown as escapes
    (a U+202E would reverse every block label after it)."""
    return html.escape(visible_bidi(str(value)))


def text_html(snapshot, decode=None, include_done: bool = True) -> str:
    seqs = [s for s in snapshot.sequences if include_done or s.status in ("running", "waiting", "swapped")]
    if not seqs:
        return "<p><i>No sequences yet.</i></p>"
    bs = snapshot.block_size
    refs = {b.block_id: b.ref_count for b in snapshot.blocks}
    parts = []
    for s in seqs:
        toks = token_strings(s.token_ids, decode)
        head = (f"<b>seq {s.seq_id}</b> · req {_text(s.request_id)} · {_text(s.status)}"
                + (f" ({_text(s.finish_reason)})" if s.finish_reason else "")
                + f" · {len(toks)} tokens ({s.prompt_len} prompt)")
        groups = []
        for logical in range(0, max(1, cdiv(len(toks), bs))):
            chunk = toks[logical * bs:(logical + 1) * bs]
            if not chunk:
                break
            in_table = logical < len(s.block_table)
            # a just-sampled token has no slot yet: its K/V is written on the next step
            phys = block_label(s.block_table[logical], s.device) if in_table else "next step"
            spans = []
            for j, t in enumerate(chunk):
                pos = logical * bs + j
                # a token whose K/V is not written yet (the one just sampled, also mid-block)
                # is drawn pending: dashed, until a step computes it
                pending = pos >= s.num_computed and s.status != "finished"
                look = ("color:#666" if pos < s.prompt_len else
                        "color:#000;font-weight:bold;text-decoration:underline")
                if pending:
                    look += ";outline:1px dashed #D55E00;outline-offset:-1px"
                kind = "prompt" if pos < s.prompt_len else "generated"
                sep = "border-right:1px dotted #9aa;" if j < len(chunk) - 1 else ""
                spans.append(f'<span class="{kind}" style="{look};{sep}"'
                             f'{" data-pending" if pending else ""}>'
                             f'{_text(t).replace(chr(10), "↵")}</span>')
            state = ("swapped" if s.device == "cpu" else
                     "shared" if in_table and refs.get(s.block_table[logical], 0) > 1 else "used")
            band = (f"background:{_BANDS[logical % 2]};border-left:4px solid "
                    f"{STATE_COLORS[state]}" if in_table else "border:1px dashed #555")
            groups.append(
                f'<span class="{"blk " + state if in_table else "pending"}" '
                f'style="{band};padding:1px 3px;'
                f'margin-right:2px;white-space:pre-wrap">'
                f'<sup style="color:#0072B2;font-weight:bold">{phys}</sup>{"".join(spans)}</span>')
        parts.append(f'<div class="seqtext" style="margin:6px 0;line-height:1.9;font-size:16px">'
                     f'{head}<br>{"".join(groups)}</div>')
    return "\n".join(parts)
