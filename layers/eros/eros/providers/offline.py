"""Offline providers: deterministic, no network, for running the whole system with no keys.

Used only when no key or base URL is configured (see ``eros.providers``), announced at start-up,
and marked in what they produce (``offline=True``, model names starting with ``offline/``).
The hashing embedder keeps recall meaningful by word overlap: texts that share words (or, for
Chinese, character pairs) get a positive cosine similarity.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from ..config import EMBED_DIM
from .embed import Embeddings, InputType
from .llm import Completion

_WORD = re.compile(r"[a-z0-9']+|[\u3400-\u9fff]+")
_STOP = frozenset("a an the and or but i im i'm me my you your to of in on at is am are was were be it this that"
                  " with for so just do did have has had not no".split())


def _features(text: str) -> list[str]:
    features: list[str] = []
    for token in _WORD.findall(text.lower()):
        if token[0] >= "\u3400":  # CJK run: characters and character bigrams
            features.extend(token)
            features.extend(token[i:i + 2] for i in range(len(token) - 1))
        elif token not in _STOP:
            features.append(token[:-1] if len(token) > 4 and token.endswith("s") else token)  # crude plural fold
    return features


def hash_embed(text: str) -> list[float]:
    vector = [0.0] * EMBED_DIM
    for feature in _features(text):
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % EMBED_DIM
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:  # no features at all: a fixed unit vector, so cosine stays defined
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


class HashingEmbedder:
    model = "offline/lexical-hash-512"

    def describe(self) -> str:
        return f"OFFLINE lexical hashing embedder ({EMBED_DIM}-d, word overlap only)"

    def embed(self, texts: list[str], input_type: InputType, *, deadline=None) -> Embeddings:
        return Embeddings(vectors=[hash_embed(t) for t in texts], model=self.model,
                          usage={"total_tokens": 0}, offline=True)


class OfflineChat:
    model = "offline/echo"

    def describe(self) -> str:
        return "OFFLINE deterministic chat model (echoes, no network)"

    def complete(self, model: str, messages: list[dict], *, max_tokens: int = 600, temperature: float = 0.7,
                 deadline=None, json_mode: bool = False) -> Completion:
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        from .. import deep_pass  # the offline deep-pass planner lives with the deep pass
        if json_mode and messages and messages[0]["content"] == deep_pass.SYSTEM_PROMPT:
            text = json.dumps({"actions": deep_pass.offline_actions(last_user)}, ensure_ascii=False)
        elif json_mode:
            from ..extraction import offline_candidates  # the offline extractor lives with extraction
            text = json.dumps({"memories": offline_candidates(last_user)}, ensure_ascii=False)
        else:
            system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
            known = system.count("\n- ")
            text = (f"(offline model) You said: \u201c{last_user[:200]}\u201d. "
                    f"I have {known} memory line(s) about you in front of me.")
        return Completion(text=text, model=self.model, usage={"prompt_tokens": 0, "completion_tokens": 0},
                          offline=True)


# --- what the offline stand-ins know about consolidation -------------------------------------------
# A few "slots" hold one current value each: a person lives in one city and has one job at a time.
# Two statements about the same slot that say different things are an update (the newer wins);
# everything else ("has a daughter, Mia" and "Mia started school") is left alone. Crude and
# English/Chinese only, but deterministic, and it lets the local stack show consolidation with no keys.
_SLOTS = [
    ("home", re.compile(r"\b(live|lives|living|lived|moved|moving|relocated|relocating)\b.*\b(in|to)\b"
                        r"|住在|搬到|搬去|住", re.I)),
    ("job", re.compile(r"\b(work|works|working) (as|at|for|in)\b|\bmy (new )?job\b|\bjob (as|at)\b"
                       r"|在.{1,12}(工作|上班)|换了工作|当", re.I)),
    ("partner", re.compile(r"\b(boyfriend|girlfriend|fianc[ée]e?|husband|wife)\b|男朋友|女朋友|老公|老婆", re.I)),
    ("diet", re.compile(r"\b(vegetarian|vegan|eat(ing)? meat)\b|吃素", re.I)),
]
_SAID = re.compile(r"^the user said:\s*", re.I)
_KEY_DROP = re.compile(r"[^\w\s]")


def topic_slot(text: str) -> str | None:
    """The one-value slot a statement is about (home, job, partner, diet), or None."""
    return next((name for name, rule in _SLOTS if rule.search(text)), None)


def statement_key(text: str) -> str:
    """Two memories with the same key say the same thing (case, punctuation, the offline prefix folded)."""
    return " ".join(_KEY_DROP.sub(" ", _SAID.sub("", text.strip()).casefold()).split())
