"""Turn raw model output into an :class:`Answer` that is grounded, or INSUFFICIENT_INFO.

A small model invents answers to unanswerable questions, so the prompt is not trusted alone:

- the answer must say something the question does not (``no_content``; with quotes on, an
  answer that only points at passages, "the function is [2].", is quoted from them);
- its new content words must occur in the cited passages, numbers and identifiers near a
  question word there, section numbers not counting (``unsupported``, ``key_unanchored``);
- a question that asks for a number (how many, which version, what value, a limit) needs a
  number the question does not already hold (``no_number``);
- else, with quotes on, the top passage's best sentence may stand in: a prose sentence (or a
  window of a run-on one) holding most of the question's words and every version or variant
  it names ("1p", "4.2.2").

Any failure makes the answer exactly INSUFFICIENT_INFO, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from generator.prompt import SECTION_NUMBER, body_sentences
from ragline.markdown import read_table
from ragline.text import TOKEN, content_tokens, sentences, stem, stems
from ragline.types import INSUFFICIENT_INFO, Answer, Citation, Hit

_SYMBOL = re.compile(r"(?<![\w'’.$:-])([b-hj-zB-HJ-Z0-9])(?![\w'’$:-]|\.\w)")
"""A character standing alone: a one-digit number or a one-letter name (the arguments ``m``,
``n`` and ``k``; ``C``). Not "a" or "I", not the ``s`` of "R's" or the ``t`` of "don't"."""


def answer_words(text: str) -> set[str]:
    """The content words the checks compare (:func:`ragline.text.content_tokens`), and the
    1-character tokens that drops which still state something (:data:`_SYMBOL`): "Bit 4" states
    a number, "the arguments m, n and k" three names."""
    return content_tokens(text) | {c.lower() for c in _SYMBOL.findall(text)}


def new_content(body: str, question: str) -> set[str]:
    """The answer's words that the question lacks, also in another form: "recommended" adds
    nothing to "which functions does it recommend"; counted as new, it made a right answer
    phrased in the question's words fail the support check when the passage words it
    otherwise."""
    asked = stems(question)
    return {w for w in answer_words(body) - answer_words(question) if stem(w) not in asked}


class Reason(StrEnum):
    """Why an answer is INSUFFICIENT_INFO: :attr:`Answer.reason`, and the ``reason`` label of
    ``ragline_insufficient_total``. The values are the wire strings clients and reports read.

    Attributes:
        NO_EVIDENCE: no passage reached the generator (none retrieved, or all filtered out).
        MODEL_ABSTAINED: the model itself answered INSUFFICIENT_INFO.
        EMPTY_OUTPUT: nothing left of the output once cleaned (a lone "The answer is:").
        NO_CONTENT: the answer says nothing the question does not: no new content word, or
            only filler ("... take the following arguments").
        UNSUPPORTED: fewer than ``min_support`` of the answer's new content words occur in the
            passages it cites (or in any passage, when it cites none), or a name, number or
            identifier it adds occurs in none of them.
        KEY_UNANCHORED: a number or identifier the answer adds occurs in the cited passages
            only far from every question word (an invented "100 bytes").
        NOT_IN_ONE_ROW: the answer cites a table, and no row of it holds the answer's words
            beside a cell the question names (a value read off a neighbouring row).
        NO_NUMBER: the question asks for a number (how many, which version, what value) and
            the answer states none the question does not already hold.
        NOT_CONFIRMED: the answer passed every check above, but the model, reading the cited
            passages again in a fresh prompt, did not confirm that they state it
            (``RAGLINE_GENERATOR_VERIFY_MIN_P``; :mod:`generator.verify`).
    """

    NO_EVIDENCE = "no_evidence"
    MODEL_ABSTAINED = "model_abstained"
    EMPTY_OUTPUT = "empty_output"
    NO_CONTENT = "no_content"
    UNSUPPORTED = "unsupported"
    KEY_UNANCHORED = "key_unanchored"
    NOT_IN_ONE_ROW = "not_in_one_row"
    NO_NUMBER = "no_number"
    NOT_CONFIRMED = "not_confirmed"


CITATION = re.compile(r"\[(\d{1,2})\]")
"""A citation marker in an answer: ``[n]``, n the passage's number."""
_LEAD_IN = re.compile(r"^\s*(the\s+)?answer(\s+is)?\s*:\s*", re.I)


def clean_output(raw: str, max_sentences: int = 2) -> str:
    """First non-empty paragraph, without list numbering, repeated sentences (greedy decoding
    of a small model loops) or a trailing 'The answer is:'; at most ``max_sentences``."""
    text = _LEAD_IN.sub("", raw.strip()).strip()
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.strip() and not paragraph.strip().endswith(":"):  # skip "The answer is:"
            text = paragraph.strip()
            break
    lines = [re.sub(r"^\s*(\d+\.|[-*])\s+", "", line).strip() for line in text.splitlines()]
    seen: list[str] = []
    for line in lines:
        if line and line not in seen:
            seen.append(line)
    text = re.sub(r"\s*(the answer is|answer)\s*:?\s*$", "", " ".join(seen), flags=re.I)
    kept: list[str] = []
    for sentence in sentences(text):
        if not any(seen_s.startswith(sentence) for seen_s in kept):
            kept.append(sentence)
    if len(kept) > 1 and not re.search(r"[.!?)\]]$", kept[-1]):
        kept.pop()  # an unfinished sentence cut off by the token limit
    return " ".join(kept[:max_sentences]).strip()


_KEY = re.compile(r"\d|_|\(|[A-Za-z]\.[A-Za-z]|[A-Z].*[A-Z]")


def key_tokens(words: set[str], raw: str) -> set[str]:
    """The answer's load-bearing tokens: numbers, code identifiers (read.fwf, R_HOME, f(x)),
    acronyms. ``words`` are lower-cased content tokens; ``raw`` keeps the original case."""
    cased = {t.strip(".:-") for t in TOKEN.findall(raw)}
    keys = {t.lower() for t in cased if _KEY.search(t)}
    return {w for w in words if w in keys}


def anchored(
    keys: set[str], passage_words: list[str], question_words: set[str], window: int
) -> set[str]:
    """The ``keys`` that occur in the passage within ``window`` words of a question word, or
    of an anchored occurrence of another key: an invented number or name tends to sit nowhere
    near what the question asks about, while a run of values copied whole ("a text area of
    468pt × 622pt or 16.45cm × 21.9cm or 6.5in × 8.6in") is anchored by its start."""
    marks = [i for i, w in enumerate(passage_words) if w.strip(".,;:()[]'\"") in question_words]
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for key in sorted(keys - found):
            near = [
                i
                for i, word in enumerate(passage_words)
                if key in word and any(abs(i - m) <= window for m in marks)
            ]
            if near:
                found.add(key)
                marks += near
                grew = True
    return found


_FILLER_TEXT = """following follow below above shown given called named listed mentioned
described said take takes taken include includes included"""
FILLER = frozenset(stem(w) for w in _FILLER_TEXT.split())
"""Stems of the words an answer that only restates the question adds ("... take the following
additional arguments:"): they say nothing the question did not."""

_ASKS_NUMBER = re.compile(
    r"\b(how (many|much|long|old|large|big|fast|far|heavy|wide|tall|deep)|(what|which) "
    r"([\w-]+ ){0,2}(year|version|value|percentage|factor|speed|temperature|frequency|weight"
    r"|distance|depth|duration|capacity|voltage|pressure)|(what|which) number|in what year"
    r"|(maximum|minimum|max|min|default) (number|size|length|value|version|width|height|count)"
    r"|(page|word|size|character|length|time) limits?|font size"
    r"|in (rpm|[kmg]?hz|seconds|minutes|hours|days|[kmg]?i?bytes|[kmg]i?b|pt|points|mm|cm|inches"
    r"|degrees|percent|kg|grams|volts|watts|metres|meters|km|miles))\b",
    re.I,
)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")


def expects_number(question: str) -> bool:
    """Whether the question asks for a number: how many/much/long/fast/far, what
    year/version/value/speed/temperature, a maximum/minimum/default size, a page or word
    limit, a font size, or an answer in a unit ("in rpm", "in points")."""
    return bool(_ASKS_NUMBER.search(question))


def new_number(text: str, question: str) -> bool:
    """Whether ``text`` states a number the question does not, in digits (a number word, "two
    columns", is too often not the answer)."""
    asked = set(_NUMBER.findall(question))
    return any(n not in asked for n in _NUMBER.findall(text))


QUOTE_MIN_COVERAGE = 0.6
"""Share of the question's words an evidence sentence must hold to be quoted. On the dev set
(hybrid retrieval): at 0.5, 11 quotes were right and 18 wrong or answered an unanswerable
question; at 0.6, 10 right and 11 wrong; 0.7 keeps 8 right, 5 wrong but also refuses "How do
you read a fixed-width format file in R?" (its read.fwf sentence holds 3 of 5 words)."""


QUOTE_MAX_WORDS = 40
"""A "sentence" longer than this is a run-on (a list, a code block, a table's text): it is
quoted by its windows of :data:`QUOTE_WINDOW` words, so a quote stays a quote, not a dump."""
QUOTE_WINDOW = 32


def support_of(hit: Hit) -> str:
    """A passage's text as support for an answer: without the numbers that open its sections
    ("6.1.2 Configuration Information"), which are no answer to anything."""
    return " ".join(SECTION_NUMBER.sub("", s) for s in sentences(hit.chunk.text))


def prose(unit: str, min_share: float = 0.6) -> bool:
    """Whether a unit reads as text, not code or data: most of its tokens are words."""
    tokens = unit.split()
    words = sum(t.strip(".,;:!?()[]'\"‘’“”").isalpha() for t in tokens)
    return bool(tokens) and words >= min_share * len(tokens)


def quotable(units: Sequence[str]) -> list[str]:
    """Quote candidates: each sentence that reads as prose, or the overlapping windows of a
    run-on one."""
    out: list[str] = []
    for unit in units:
        if not prose(unit):
            continue  # code ("hexcolorv <- colorConverter(...)"), a data listing
        words = unit.split()
        if len(words) <= QUOTE_MAX_WORDS:
            out.append(unit)
            continue
        step = QUOTE_WINDOW // 2
        for start in range(0, len(words) - step, step):
            window = " ".join(words[start : start + QUOTE_WINDOW])
            head = "… " if start else ""
            tail = " …" if start + QUOTE_WINDOW < len(words) else ""
            out.append(f"{head}{window}{tail}")
    return out


def quote_for(
    question: str, keys: set[str], evidence: Sequence[Hit], numbers: Sequence[int] = (1,)
) -> tuple[str, int] | None:
    """The sentence of the best-ranked passage that best answers the question, as
    ``(sentence, 1)``, or None when none holds :data:`QUOTE_MIN_COVERAGE` of the question's
    words.

    Only the top passage is quoted from (or the passages ``numbers`` names): it is the one
    the retrievers agree on, and a
    sentence of a lower passage that shares the question's words is more often about a
    neighbouring topic (read.epiinfo's "fixed-width text format" beside read.fwf's section).
    A sentence scores its share of the question's (stemmed) words, plus a quarter for naming
    something the question does not (an identifier or number: what a "which function" or
    "how many" question asks for), plus a quarter for carrying one of the model's ``keys``.
    """
    asked = stems(question)
    if len(asked) < 2:
        return None
    asked_raw = answer_words(question)
    specific = {t for t in asked_raw if any(c.isdigit() for c in t)}
    best: tuple[float, str, int] | None = None
    for n in numbers:
        if not 1 <= n <= len(evidence):
            continue
        for sentence in quotable(body_sentences(evidence[n - 1])):
            coverage = len(asked & stems(sentence)) / len(asked)
            if coverage < QUOTE_MIN_COVERAGE:
                continue
            words = answer_words(sentence)
            if not specific <= words:
                continue  # "elsarticle's 1p layout": a sentence without "1p" is about another
            names = key_tokens(words - asked_raw, sentence)
            score = coverage + 0.25 * bool(names) + 0.25 * bool(keys & words)
            if best is None or score > best[0]:
                best = (score, sentence.strip(), n)
    return None if best is None else (best[1], best[2])


OFF_QUESTION_MARGIN = 0.3
"""How much more of the question a quotable sentence must hold than the model's answer for the
answer to count as off the question."""


def row_supported(question: str, new_words: set[str], hit: Hit) -> bool:
    """Whether a table answer's words sit in one row whose cells name something the question
    names: a cell read off another row (the answer's words all occur in the table, but in the
    Poisson row for a question about the log-normal one) is no answer."""
    table = read_table(hit.chunk.text)
    if not table.rows:
        return True  # no rows to tell apart
    header = answer_words(" ".join(table.header))
    asked = answer_words(question) - header
    for row in table.rows:
        cells = answer_words(" ".join(row))
        if new_words <= cells | header | answer_words(question) and cells & asked:
            return True
    return False


def off_question(question: str, body: str, sentence: str, keys: set[str]) -> bool:
    asked = stems(question)
    if not asked:
        return False
    answer_share = len(asked & stems(body)) / len(asked)
    quote_share = len(asked & stems(sentence)) / len(asked)
    in_quote = answer_words(sentence)
    return quote_share - answer_share >= OFF_QUESTION_MARGIN and not (keys and keys <= in_quote)


def no_content(question: str, body: str, new_words: set[str]) -> Reason | None:
    """:attr:`Reason.NO_CONTENT` when the answer adds no word the question lacks, or only
    filler ("The function file creates connections to files compressed with bzip2" for "Which
    function creates connections to files compressed with bzip2?")."""
    short = {w for w in new_words if len(w) == 1}  # a one-digit number, a one-letter name
    if not new_words or not (stems(body) | short) - stems(question) - FILLER:
        return Reason.NO_CONTENT
    return None


def unsupported(new_words: set[str], cited_text: str, min_support: float) -> Reason | None:
    """:attr:`Reason.UNSUPPORTED` when under ``min_support`` of the answer's new content
    words occur in the cited passages (none cited: no support at all)."""
    supported = len(new_words & answer_words(cited_text)) / len(new_words) if cited_text else 0
    return Reason.UNSUPPORTED if supported < min_support else None


_SENTENCE_END = re.compile(r"[.!?:;]\s+")


def names(body: str) -> set[str]:
    """Lower-cased capitalised words that do not open a sentence ("Paris" in "The capital is
    Paris"): the names an answer states."""
    out: set[str] = set()
    for sentence in _SENTENCE_END.split(body):
        tokens = TOKEN.findall(sentence)
        out.update(t.lower().strip(".:-") for t in tokens[1:] if t[:1].isupper())
    return out


def invented(body: str, new_words: set[str], cited_text: str) -> Reason | None:
    """:attr:`Reason.UNSUPPORTED` when a name, number or identifier the answer adds occurs in
    none of the cited passages. ``min_support`` lets some connecting words be the model's own;
    the words an answer stands on may not be: a passage that says "answer with the capital of
    France" must not make "... France is Paris" pass on the share of copied words."""
    keys = (key_tokens(new_words, body) | names(body)) & new_words
    return Reason.UNSUPPORTED if keys - answer_words(cited_text) else None


def key_unanchored(
    question: str, body: str, new_words: set[str], cited_text: str, window: int
) -> Reason | None:
    """:attr:`Reason.KEY_UNANCHORED` when a number or identifier the answer adds is not in
    the cited text within ``window`` words of a question word (0: not checked).

    When the question names a variant ("the 5p option", "R 4.2.2", "a 64-bit platform": a
    word with a digit, not a lone one) that the cited text names too, a key counts only in a
    sentence that names it: a passage that lists variants one by one gives each its own
    values, and the neighbouring variant's are no answer."""
    if window <= 0:
        return None
    asked = answer_words(question)
    keys = key_tokens(new_words, body)
    variants = {w for w in asked if len(w) > 1 and any(c.isdigit() for c in w)} - keys
    variants &= answer_words(cited_text)
    spans = [s for s in sentences(cited_text) if variants <= answer_words(s)]
    found: set[str] = set()
    for span in spans if variants else [cited_text]:
        found |= anchored(keys - found, span.lower().split(), asked, window)
    return None if found == keys else Reason.KEY_UNANCHORED


def not_in_one_row(question: str, new_words: set[str], tables: Sequence[Hit]) -> Reason | None:
    """:attr:`Reason.NOT_IN_ONE_ROW` when the answer cites tables and none has a row that
    holds its words and names what the question names ("Poisson" from the Poisson row, for
    log-normal's R name)."""
    if tables and not any(row_supported(question, new_words, hit) for hit in tables):
        return Reason.NOT_IN_ONE_ROW
    return None


def no_number(question: str, text: str) -> Reason | None:
    """:attr:`Reason.NO_NUMBER` when the question asks how many / which version / what value
    and ``text`` (without citation markers) states no number the question does not."""
    if expects_number(question) and not new_number(text, question):
        return Reason.NO_NUMBER
    return None


def drop_foreign_markers(text: str, n_passages: int) -> str:
    """The text without citation markers that name no passage ("[2]" with one passage)."""
    kept = CITATION.sub(lambda m: m.group() if 1 <= int(m.group(1)) <= n_passages else "", text)
    return re.sub(r" {2,}", " ", kept).strip()


def cite_by_words(new_words: set[str], evidence: Sequence[Hit]) -> list[int]:
    """For an answer without a usable [n]: the (at most two) passages that carry the most of
    its new words."""
    coverage = [
        (len(new_words & answer_words(h.chunk.text)), n) for n, h in enumerate(evidence, start=1)
    ]
    best = max(c for c, _ in coverage)
    return [n for c, n in coverage if c == best and c > 0][:2]


def cite_the_rest(new_words: set[str], cited: Sequence[int], evidence: Sequence[Hit]) -> list[int]:
    """``cited`` and the passages not cited that hold words of the answer the cited ones lack.

    A small model cites one passage for an answer drawn from two ("`write.csv2` and
    `read.csv2` [1]" with the second name in [3]): the answer is grounded in what it was
    given, under-cited. The caller checks the answer again against the wider citations (and
    the second reading then reads them all): nothing ungrounded passes this way."""
    covered = answer_words(" ".join(support_of(evidence[n - 1]) for n in cited))
    missing = new_words - covered
    more = [
        n
        for n, hit in enumerate(evidence, start=1)
        if n not in cited and missing & answer_words(support_of(hit))
    ]
    return sorted([*cited, *more])


def grounding_failure(
    question: str,
    body: str,
    new_words: set[str],
    cited: Sequence[int],
    evidence: Sequence[Hit],
    min_support: float,
    key_window: int,
) -> Reason | None:
    """The first grounding check the answer fails, in order: support, no invented name or
    number, anchored keys, one table row, a number when one is asked for."""
    cited_text = " ".join(support_of(evidence[n - 1]) for n in cited)
    tables = table_numbers(cited, evidence)
    return (
        unsupported(new_words, cited_text, min_support)
        or invented(body, new_words, cited_text)
        or key_unanchored(question, body, new_words, cited_text, key_window)
        or not_in_one_row(question, new_words, [evidence[n - 1] for n in tables])
        or no_number(question, body)
    )


def table_numbers(cited: Sequence[int], evidence: Sequence[Hit]) -> list[int]:
    """The cited passages that are tables."""
    return [n for n in cited if evidence[n - 1].chunk.kind == "table"]


def check_answer(
    question: str,
    raw_output: str,
    evidence: Sequence[Hit],
    min_support: float = 0.6,
    key_window: int = 0,
    quote: bool = False,
    quote_off_question: bool = True,
) -> Answer:
    """Parse citations and apply the checks; a failed one makes the answer INSUFFICIENT_INFO
    with its :class:`Reason` (or, with ``quote``, a quote of the top passage stands in).

    Args:
        question: the user's question (its words do not count as support).
        raw_output: what the model generated.
        evidence: the passages, numbered [1]..[n] in the prompt.
        min_support: share of the answer's new content words that must occur in the cited text.
        key_window: when > 0, every number or identifier the answer adds must occur in the cited
            text within this many words of a question word (``key_unanchored`` otherwise).
        quote: let the top passage's best sentence replace a failed or off-question answer,
            and an answer that only points at passages ("the function is [2].") be answered
            by the best sentence of those it cites.
        quote_off_question: with ``quote``, also replace an answer that passed the checks but
            holds far less of the question than that sentence (off: only failed answers).
    """
    text = clean_output(raw_output)
    if not evidence:
        return Answer.insufficient_info(Reason.NO_EVIDENCE)
    if INSUFFICIENT_INFO in text:
        return Answer.insufficient_info(Reason.MODEL_ABSTAINED)
    if not text:
        return Answer.insufficient_info(Reason.EMPTY_OUTPUT)
    text = drop_foreign_markers(text, len(evidence))
    cited = sorted({int(n) for n in CITATION.findall(text)})
    body = CITATION.sub("", text).strip()
    new_words = new_content(body, question)
    empty = no_content(question, body, new_words)
    if empty:
        # "The vectorized version of the if/else construct is [2].": the model pointed at the
        # passage holding the answer instead of writing it; quote that passage's best sentence
        found = quote_for(question, set(), evidence, cited) if quote and cited else None
        if found is None:
            return Answer.insufficient_info(empty)
        return _finished(question, f"{found[0]} [{found[1]}]", [found[1]], evidence)
    cited = cited or cite_by_words(new_words, evidence)
    reason = grounding_failure(question, body, new_words, cited, evidence, min_support, key_window)
    if reason is Reason.UNSUPPORTED:
        wider = cite_the_rest(new_words, cited, evidence)
        if wider != cited and not grounding_failure(
            question, body, new_words, wider, evidence, min_support, key_window
        ):
            reason, cited = None, wider
    keys = key_tokens(new_words, body)
    if reason is None and quote and quote_off_question:
        # A supported answer can still be off the question: SmolLM2 sometimes copies the
        # neighbouring sentence ("read.fortran is a similar function" for "how do you read a
        # fixed-width file", where read.fwf is the answer). When the top passage has a sentence
        # that holds far more of the question and none of the answer's own identifiers, quote it.
        found = quote_for(question, keys, evidence)
        if found is not None and off_question(question, body, found[0], keys):
            text, cited = f"{found[0]} [{found[1]}]", [found[1]]
    if reason is not None:
        numbers = table_numbers(cited, evidence) if reason is Reason.NOT_IN_ONE_ROW else (1,)
        found = quote_for(question, keys, evidence, numbers) if quote else None
        if found is None:
            return Answer.insufficient_info(reason)
        text, cited = f"{found[0]} [{found[1]}]", [found[1]]
    return _finished(question, text, cited, evidence)


def _finished(question: str, text: str, cited: list[int], evidence: Sequence[Hit]) -> Answer:
    """The last checks of an answer or a quote standing in for it, and its citations."""
    reason = no_number(question, CITATION.sub("", text))  # a quote may lack the number
    if reason:
        return Answer.insufficient_info(reason)
    # A quoted sentence may carry markers of its own document ("... with [3] after it"): in
    # the answer they would read as citations it does not make.
    text = re.sub(r"\s{2,}", " ", CITATION.sub(lambda m: _kept(m, cited), text)).strip()
    shown = {int(n) for n in CITATION.findall(text)}
    if unshown := [n for n in cited if n not in shown]:  # no markers, or citations widened
        text = f"{text} " + "".join(f"[{n}]" for n in unshown)
    return Answer(text=text, citations=citations_for(cited, evidence))


def _kept(marker: re.Match[str], cited: Sequence[int]) -> str:
    return marker[0] if int(marker[1]) in cited else ""


def citations_for(cited: Sequence[int], evidence: Sequence[Hit]) -> tuple[Citation, ...]:
    """The [n] markers as citations: chunk, document, pages and source of each passage."""
    return tuple(
        Citation(
            number=n,
            chunk_id=evidence[n - 1].chunk.chunk_id,
            doc_id=evidence[n - 1].chunk.doc_id,
            pages=evidence[n - 1].chunk.pages,
            source=evidence[n - 1].chunk.source,
        )
        for n in cited
    )
