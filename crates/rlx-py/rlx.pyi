"""rlx: an ML compiler and runtime for transformer inference (Rust), for Python.

- :class:`SentenceEmbedder`: sentence embeddings as a float32 numpy array.
- :class:`LlamaModel`: text generation with a Llama-family GGUF.
- :class:`Graph` / :class:`Session`: build a graph, compile it (hybrid or
  thunks), run it and read the split plan.

Errors from the Rust library are :class:`RlxError` (or a subclass) with the
library's message; bad argument types and values are ``TypeError`` /
``ValueError``.
"""

import os
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, TypedDict

import numpy as np
import numpy.typing as npt

__version__: str

class RlxError(Exception):
    """Base class of every error rlx raises from the Rust library."""

class ModelLoadError(RlxError):
    """A model could not be found, fetched or loaded."""

class GraphError(RlxError):
    """A graph is ill-formed (unknown node, shape mismatch, verify failure)."""

class ExecutionError(RlxError):
    """Compiling or running a model failed."""

class DeviceError(RlxError):
    """The requested device cannot be used: no CUDA backend in this build,
    the CUDA libraries or a CUDA device missing, or an ordinal out of range."""

HAS_CUDA: bool
"""Whether this build has the CUDA backend (``maturin build --features cuda``)."""

def cuda_device_count() -> int:
    """CUDA devices this build can use: 0 without the CUDA backend, or when
    the CUDA libraries or a device are missing."""

class SentenceEmbedder:
    """A sentence-transformers BERT model (e.g. all-MiniLM-L6-v2).

    Safe to share between threads: ``encode`` releases the GIL and calls
    run one after the other on the model's own thread pool.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "minilm",
        device: str = "cpu",
        threads: int | None = None,
        precision: Literal["f32", "bf16", "f16"] = "f32",
    ) -> None:
        """Load ``model``: "minilm" or "mpnet" (all-MiniLM-L6-v2 /
        all-mpnet-base-v2, fetched into ``$RLX_MODELS_DIR`` or
        ``~/.cache/rlx/models`` on first use) or a sentence-transformers
        directory (BERT, XLM-RoBERTa or MPNet).
        ``device``: "cpu" or "cuda[:N]" (CUDA needs a wheel built with
        ``--features cuda``; :class:`DeviceError` when the device cannot be
        used). ``threads``: CPU worker threads (None: one per
        core). ``precision``: "f32"; "bf16" (bf16 matmuls, f32
        accumulation); "f16" (CPU: f16 weight storage, f32 products; CUDA:
        f16 matmuls)."""

    def encode(
        self,
        texts: Sequence[str] | Iterable[str] | npt.NDArray[Any] | Any,
        batch_size: int = 32,
        normalize: bool = True,
        show_progress: bool = False,
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` (a list/iterable of str, a 1-D numpy string array
        or a pyarrow string array): float32 array ``[len(texts), dim]``.
        The model's default prompt (``default_prompt_name``), if any, is
        prepended. ``batch_size``: 1 to 1024 texts per model run (texts
        grouped by token length, so a run pads little and each row equals
        the text's embedding alone; rows return in input order).

        ``normalize=False``: the model's own pipeline as configured, as
        sentence-transformers' ``encode(normalize_embeddings=False)``: its
        pooling (cls, mean, max, lasttoken, ... from the Pooling module),
        then its Normalize module when ``modules.json`` lists one (so
        all-MiniLM-L6-v2's rows stay unit length; a model without one, e.g.
        GTE-like, gives rows of other lengths). ``normalize=True`` (the
        default): those rows L2-normalized, as
        ``normalize_embeddings=True`` (rows of a pipeline that ends in
        Normalize are unit length already and come back unchanged).
        ``show_progress``: print progress to stderr. Releases the GIL."""

    @property
    def dim(self) -> int:
        """Embedding width."""
    @property
    def max_seq_length(self) -> int:
        """Most tokens read per text (longer texts are truncated)."""
    @property
    def path(self) -> str:
        """The model directory."""
    @property
    def device(self) -> str:
        """"cpu" or "cuda:N"."""
    @property
    def precision(self) -> str:
        """"f32", "bf16" or "f16"."""

class RankedDocument(TypedDict, total=False):
    """One document of :meth:`Reranker.rank`."""

    corpus_id: int
    score: float
    text: str

class Reranker:
    """A cross-encoder reranker (a ``BertForSequenceClassification`` with
    one label, as sentence-transformers' ``CrossEncoder`` saves it).

    Safe to share between threads: calls release the GIL and run one after
    the other.
    """

    def __init__(self, model: str | os.PathLike[str], threads: int | None = None) -> None:
        """Load the cross-encoder directory ``model``. ``threads``: CPU
        worker threads (None: one per core)."""

    def rerank(self, query: str, documents: Sequence[str]) -> npt.NDArray[np.float32]:
        """The relevance of each document to ``query``: float32 scores in
        input order (the model's activation applied, sigmoid by default,
        as ``CrossEncoder.predict``). Releases the GIL."""

    def predict(
        self,
        pairs: Iterable[tuple[str, str] | list[str]],
        batch_size: int = 32,
    ) -> npt.NDArray[np.float32]:
        """The scores of ``(query, document)`` pairs, as
        ``CrossEncoder.predict(pairs)``: float32 array ``[len(pairs)]`` in
        input order (the model's activation applied, sigmoid by default).
        ``pairs``: a list (or any iterable) of tuples or lists of two str.
        ``batch_size``: 1 to 1024 pairs per forward pass (scores do not
        depend on it beyond float rounding). A pair that is not two str
        raises ``TypeError`` (``ValueError`` for a tuple or list of another
        length) naming it; a single pair not in a list is refused
        (``TypeError``: wrap it in a list). Releases the GIL."""

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
    ) -> list[RankedDocument]:
        """The documents best first, as ``CrossEncoder.rank``:
        ``{"corpus_id", "score"}`` dicts (with ``"text"`` when
        ``return_documents``), the best ``top_k`` only when given."""

    @property
    def max_length(self) -> int:
        """Most tokens read per (query, document) pair."""
    @property
    def path(self) -> str:
        """The model directory."""

class ChatMessage(TypedDict):
    """One chat turn."""

    role: str
    content: str

class TextStream(Iterator[str]):
    """Text pieces of one generation, as they are produced."""

    def __iter__(self) -> TextStream:
        """The stream itself."""
    def __next__(self) -> str:
        """The next piece (each step releases the GIL)."""
    @property
    def finish_reason(self) -> Literal["stop", "length"] | None:
        """Why it ended ("stop": end token or stop string; "length":
        max_tokens), None while running."""
    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far."""

class LlamaModel:
    """A Llama-family GGUF model (``llama``/``qwen2``), on the CPU.

    One sequence at a time: a new generation ends an unfinished stream of
    the same model (its next step raises :class:`RlxError`).
    """

    def __init__(
        self,
        gguf: str | os.PathLike[str] = "smollm2",
        device: str = "cpu",
        ctx: int = 2048,
        threads: int | None = None,
        int8_activations: bool = False,
    ) -> None:
        """Load ``gguf``: "smollm2" (SmolLM2-135M-Instruct Q4_1, fetched on
        first use) or a ``.gguf`` path. ``device``: "cpu" or "cuda[:N]"
        (CUDA needs a wheel built with ``--features cuda``;
        :class:`DeviceError` when the device cannot be used). ``ctx``:
        KV-cache positions. ``threads``: CPU worker threads (None: one per
        core; not used on CUDA). ``int8_activations``: llama.cpp-style 8-bit activations (faster,
        looser numerics)."""

    def generate(
        self,
        prompt: str,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        repetition_penalty: float = 1.0,
    ) -> str:
        """Text after ``prompt`` (no chat template). ``temperature=0`` is
        greedy, the same tokens as ``rlx generate``. Stops at an end token,
        a ``stop`` string (not included) or ``max_tokens``."""

    def stream(
        self,
        prompt: str,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        repetition_penalty: float = 1.0,
    ) -> TextStream:
        """``generate`` as an iterator of text pieces."""

    def chat(
        self,
        messages: Sequence[ChatMessage | Mapping[str, str]],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        repetition_penalty: float = 1.0,
        stream: bool = False,
    ) -> str | TextStream:
        """The assistant's reply to ``messages``, rendered with the GGUF's
        chat template (ChatML when absent); an iterator with ``stream=True``."""

    def apply_chat_template(self, messages: Sequence[ChatMessage | Mapping[str, str]]) -> str:
        """The prompt text ``chat`` would tokenize."""

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text`` (``add_bos`` None: as the model asks)."""

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; an id outside the vocabulary is a ValueError."""

    @property
    def ctx(self) -> int:
        """KV-cache positions."""
    @property
    def vocab_size(self) -> int:
        """Vocabulary size."""
    @property
    def arch(self) -> str:
        """``llama`` or ``qwen2``."""
    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id."""
    @property
    def eos_id(self) -> int | None:
        """End-of-sequence id."""
    @property
    def path(self) -> str:
        """The GGUF file."""

class Node:
    """A node of a :class:`Graph`."""

    @property
    def id(self) -> int:
        """Index in the graph."""
    @property
    def shape(self) -> list[int]:
        """Dimensions, outermost first."""
    @property
    def dtype(self) -> str:
        """Element type ("f32", "i64", ...)."""

_DType = Literal["f32", "i32", "i64", "u8"]

class Graph:
    """A graph under construction; ops infer their output shapes."""

    def __init__(self, name: str = "graph") -> None:
        """An empty graph."""
    def input(self, name: str, shape: Sequence[int], dtype: _DType = "f32") -> Node:
        """A graph input, fed by :meth:`Session.run`."""
    def param(self, name: str, shape: Sequence[int], dtype: _DType = "f32") -> Node:
        """A weight, set by :meth:`Session.set_param` or ``compile(params=...)``."""
    def constant(self, value: npt.NDArray[Any]) -> Node:
        """A constant tensor (float32, int32, int64 or uint8 array)."""
    def matmul(self, a: Node, b: Node) -> Node:
        """``a @ b``."""
    def activation(self, kind: str, x: Node) -> Node:
        """relu, gelu, gelu_tanh, silu, sigmoid, tanh, exp, neg, sqrt,
        rsqrt, abs, softplus or mish."""
    def binary(self, kind: str, a: Node, b: Node) -> Node:
        """add, sub, mul, div, max, min or pow, with broadcasting."""
    def add(self, a: Node, b: Node) -> Node:
        """``a + b``."""
    def mul(self, a: Node, b: Node) -> Node:
        """``a * b``."""
    def layer_norm(self, x: Node, gamma: Node, beta: Node, eps: float = 1e-5) -> Node:
        """Layer norm over the last axis."""
    def rms_norm(self, x: Node, gamma: Node, eps: float = 1e-6) -> Node:
        """RMS norm over the last axis."""
    def softmax(self, x: Node, axis: int = -1) -> Node:
        """Softmax over ``axis``."""
    def reshape(self, x: Node, shape: Sequence[int]) -> Node:
        """Same elements, new dims."""
    def transpose(self, x: Node, perm: Sequence[int]) -> Node:
        """Permute axes: ``out.shape[i] = x.shape[perm[i]]``."""
    def set_outputs(self, outputs: Sequence[Node]) -> None:
        """What :meth:`Session.run` returns, in order."""
    def compile(
        self,
        mode: Literal["hybrid", "thunks"] = "hybrid",
        device: str = "cpu",
        threads: int | None = None,
        params: Mapping[str, npt.NDArray[Any]] | None = None,
    ) -> Session:
        """Verify and compile; the graph stays usable. ``device``: "cpu" or
        "cuda[:N]" (:class:`DeviceError` when it cannot be used)."""
    def dump(self) -> str:
        """The graph as text."""
    def __len__(self) -> int:
        """Number of nodes."""
    @property
    def name(self) -> str:
        """The graph's name."""

class Session:
    """A compiled graph."""

    def set_param(self, name: str, value: npt.NDArray[Any]) -> None:
        """Set a weight (its declared shape and dtype)."""
    def run(self, inputs: Mapping[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        """Run; one array per graph output. Releases the GIL."""
    def plan(self) -> dict[str, Any]:
        """The split plan: mode, compiled_segments, thunk_ranges,
        dispatches, dispatches_thunks_only, segments, ranges (with the op
        and rule that kept each op out), declined, split, memory."""
    def plan_stats(self) -> dict[str, int]:
        """compiled_segments, thunk_ranges, dispatches."""
    @property
    def inputs(self) -> list[tuple[str, list[int], str]]:
        """(name, shape, dtype) of each graph input."""
