"""Render a model's chat template (jinja2) the way Hugging Face tokenizers do, so prompts match the training format.

Templates are untrusted text from a model folder, so they run in jinja2's immutable sandbox. The environment
offers what published templates use: `raise_exception`, `strftime_now`, a `tojson` filter that keeps non-ASCII
text, loop controls, and blocks trimmed as in transformers (trim_blocks, lstrip_blocks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from common.errors import UserError, first_line


def render_chat(
    template: str,
    messages: Sequence[dict],
    add_generation_prompt: bool = True,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """The text of `messages` ({"role": ..., "content": ...}) through `template`.

    With `add_generation_prompt` the text ends with the opening of an assistant turn, where the model writes.
    """
    import jinja2.exceptions

    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise UserError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r}")
    try:
        return _compiled(template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.exceptions.TemplateError as err:
        raise UserError(f"the model's chat template refused the messages: {first_line(err)}") from err


@lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def to_json(value, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(
            value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = to_json
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise UserError(
            f"the model's chat template is not valid jinja2 (line {err.lineno}): {err.message}"
        ) from err
