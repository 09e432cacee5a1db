"""Request bodies of the OpenAI surface (completions, chat completions) and vLLM's tokenize/detokenize.

Pure pydantic: a front end validates a body with these models, then asks `check_supported()` for the
fields whose values this server does not serve (n > 1, logprobs, a non-empty logit_bias, ...), which are
400s naming the field. Unknown fields are rejected by name (`extra="forbid"`); the OpenAI fields that do
not change the output (`user`, `metadata`, `store`, `service_tier`, ...) are accepted and ignored.

Extensions as vLLM offers them: `top_k`, `min_p`, `min_tokens`, `stop_token_ids`, `ignore_eos`, and a
completions `prompt` given as token ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from dualpath.protocol.errors import ProtocolError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
GREEDY_BELOW_TEMPERATURE = 1e-5  # vLLM's epsilon: a smaller temperature is argmax (no overflow in /T)


def _encodable(text: str) -> str:
    """Every string a tokenizer sees must be valid Unicode: a lone surrogate (`"\\ud800"`) is a 400."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not valid Unicode: lone surrogate at character {error.start}") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]
TokenId = Annotated[StrictInt, Field(ge=0, le=_INT64_MAX)]
Count = Annotated[StrictInt, Field(ge=0, le=_INT64_MAX)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage on every chunk (vLLM)


class SamplingBody(Body):
    """Fields shared by completions and chat completions."""

    model: Text | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=-1, le=_INT64_MAX)  # -1 and 0: off
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = Field(default=None, ge=_INT64_MIN, le=_INT64_MAX)
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=_INT64_MAX)
    min_tokens: Count = 0
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)  # vLLM; benchmark clients send 1.0
    n: StrictInt | None = None
    logit_bias: dict[str, float] | None = None
    user: Text | None = None
    ignore_eos: StrictBool = False
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: Text | None = None

    def stop_strings(self) -> list[str]:
        """Stop strings (empty ones drop: an empty string would match before any text)."""
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return [s for s in stops if s]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_fields(self) -> dict[str, Any]:
        """The fields that choose the next token, named as the runtime's SamplingParams names them."""
        temperature = self.temperature or 0.0
        top_k = self.top_k or 0
        return {
            "temperature": 0.0 if temperature < GREEDY_BELOW_TEMPERATURE else temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": max(top_k, 0),
            "min_p": self.min_p or 0.0,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
        }

    def check_supported(self) -> None:
        """400 naming the field for values this server does not serve."""
        if self.n is not None and self.n != 1:
            raise ProtocolError(400, f"n: only n = 1 is served, got {self.n}", param="n")
        if self.logit_bias:
            raise ProtocolError(
                400, "logit_bias: not supported (send {} or leave it out)", param="logit_bias"
            )
        if self.repetition_penalty not in (None, 1.0):
            raise _unsupported("repetition_penalty", "a repetition penalty other than 1")
        maximum = self.requested_max_tokens()
        if maximum is not None and self.min_tokens > maximum:
            raise ProtocolError(
                400, f"min_tokens ({self.min_tokens}) exceeds max_tokens ({maximum})", param="min_tokens"
            )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


def _unsupported(field: str, what: str) -> ProtocolError:
    return ProtocolError(400, f"{field}: {what} is not supported", param=field)


class CompletionBody(SamplingBody):
    """POST /v1/completions. `prompt`: text, token ids, or a list holding one of them."""

    prompt: Text | list[TokenId] | list[Text] | list[list[TokenId]]
    logprobs: StrictInt | None = None
    echo: bool = False
    best_of: StrictInt | None = None
    suffix: Text | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs is not None:
            raise _unsupported("logprobs", "returning log-probabilities")
        if self.echo:
            raise _unsupported("echo", "echoing the prompt")
        if self.best_of not in (None, 1):
            raise _unsupported("best_of", f"best_of = {self.best_of}")
        if self.suffix:
            raise _unsupported("suffix", "a suffix (insertion)")

    def single_prompt(self) -> str | list[int]:
        """The one prompt; a list of several prompts is a 400 naming `prompt`."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return prompt  # type: ignore[return-value]
        if len(prompt) != 1:
            raise ProtocolError(
                400, f"prompt: one prompt per request is served, got {len(prompt)}", param="prompt"
            )
        return prompt[0]


class TextPart(Body):
    type: Literal["text"]
    text: Text


class ChatMessage(Body):
    """One message. The null/empty tool fields a client copies from a response message are accepted."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: Text | None = None
    function_call: None = None
    audio: None = None
    annotations: list[Any] | None = None

    def text(self) -> str:
        """Text parts joined by newlines, as vLLM flattens them for a string-template model."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role  # OpenAI's newer name for system


class ChatCompletionBody(SamplingBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=_INT64_MAX)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise _unsupported("logprobs", "returning log-probabilities")
        if self.top_logprobs:
            raise _unsupported("top_logprobs", "returning log-probabilities")
        if self.tools:
            raise _unsupported("tools", "tool calling")
        if self.response_format not in (None, {"type": "text"}):
            raise _unsupported("response_format", "a structured response format")
        for index, message in enumerate(self.messages):
            if message.tool_calls:
                raise _unsupported(f"messages.{index}.tool_calls", "tool calling")

    def template_messages(self) -> list[dict[str, str]]:
        """Messages as the chat template takes them: role and text content."""
        return [{"role": m.template_role(), "content": m.text()} for m in self.messages]


class TokenizeBody(Body):
    """POST /tokenize (vLLM): a `prompt` text or chat `messages` (through the chat template)."""

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ProtocolError(400, "prompt or messages: send exactly one of them", param="prompt")

    def template_messages(self) -> list[dict[str, str]]:
        return [{"role": m.template_role(), "content": m.text()} for m in self.messages or []]


class DetokenizeBody(Body):
    """POST /detokenize (vLLM)."""

    model: Text | None = None
    tokens: list[TokenId]
