"""What every rule module uses.

The rule types, the placeholder syntax, and Go-template snippets that print a query's value
inside an annotation.

Placeholders are ``${name}``: a threshold (a module's ``THRESHOLDS``) or a snippet of the
rule's group. The syntax cannot meet Prometheus' own templates (``{{ $labels.run }}``: a ``$``
is never followed by ``{`` there) nor PromQL (``[5m]``, ``{job="x"}``), so both are written
literally, as Prometheus reads them.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field

PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


class TemplateError(ValueError):
    """A rule template names a placeholder that is neither a threshold nor a snippet."""


def fill(template: str, table: Mapping[str, str]) -> str:
    """Replace ``${name}`` placeholders in one pass.

    Inserted text is not scanned again; an unknown name is an error, not a silent blank (a
    misspelt name left in a rule would still be PromQL, and the alert would never fire). A
    value of several lines (a PromQL snippet) keeps its shape: its lines after the first are
    indented as the placeholder's line is, so a snippet is written once, flush left.
    """

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in table:
            raise TemplateError("unknown placeholder ${" + name + "}")
        value = table[name]
        if "\n" not in value:
            return value
        start = template.rfind("\n", 0, match.start()) + 1
        line = template[start : match.start()]
        indent = line[: len(line) - len(line.lstrip())]
        return value.replace("\n", "\n" + indent)

    return PLACEHOLDER.sub(sub, template)


def fill_snippets(snippets: Mapping[str, str], table: Mapping[str, str]) -> dict[str, str]:
    """Each snippet filled with ``table`` and the other snippets (a snippet may use another).

    Raises :class:`TemplateError` naming the snippet for an unknown name or a loop.
    """
    done: dict[str, str] = {}

    def resolve(name: str, path: tuple[str, ...]) -> str:
        if name in done:
            return done[name]
        if name in path:
            raise TemplateError("snippets use each other in a loop: " + " -> ".join((*path, name)))
        text = snippets[name]
        for used in PLACEHOLDER.findall(text):
            if used in snippets and used not in table:
                resolve(used, (*path, name))
        try:
            done[name] = fill(text, {**table, **done})
        except TemplateError as exc:
            raise TemplateError("snippet ${" + name + "}: " + str(exc)) from None
        return done[name]

    for name in snippets:
        resolve(name, ())
    return done


def promql(text: str) -> str:
    """A PromQL snippet written as an indented block, flush left: its ``${name}`` indents it."""
    return textwrap.dedent(text).strip()


@dataclass(frozen=True)
class Record:
    """A recording rule; ``expr`` may be an indented block."""

    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    """An alerting rule.

    ``summary`` and ``description`` may span lines here: they become one line each.
    ``runbook_url`` is derived from ``name``.
    """

    name: str
    severity: str
    expr: str
    summary: str
    description: str
    for_: str | None = None
    keep_firing_for: str | None = None
    """Prometheus' ``keep_firing_for``: how long the alert stays firing after its expression
    stops returning it (a missed scrape must not resolve it and page again)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Further annotations (name: template), one line each like the description."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels besides ``severity`` (templates allowed): a label whose value changes makes a new
    alert, hence a new notification, where the same firing alert would send none."""


@dataclass(frozen=True)
class Group:
    """A rule group; ``snippets`` are extra ``${name}`` placeholders of its annotations."""

    name: str
    rules: tuple[Record | Alert, ...]
    snippets: Mapping[str, str] = field(default_factory=dict)
    run_context: bool = False
    """Its alerts are about a run: each gets the RUN_CONTEXT annotations (the run's step, its
    newest complete checkpoint, the steps at risk), for a notification to say in one message."""
    interval: str | None = None
    """The group's own evaluation interval (may be a placeholder); None: Prometheus' global
    ``evaluation_interval``."""


# Go-template pieces. %q quotes a label value as a PromQL string inside printf.
RUN_SEL = "${target_labels_sel},run=%q"
RUN_ARGS = "${target_labels_args} $labels.run"
RANK_SEL = "${target_labels_sel},run=%q,rank=%q"
RANK_ARGS = "${target_labels_args} $labels.run $labels.rank"
INT = 'printf "%.0f"'

_QUERY_VALUE = (
    "{{ with printf `${query}` ${args} | query }}"
    "{{ . | first | value | ${fmt} }}${suffix}{{ else }}${unknown}{{ end }}"
)


def query_value(
    query: str, args: str, fmt: str = INT, unknown: str = "unknown", suffix: str = ""
) -> str:
    """Template text printing the first sample of ``query``, or ``unknown`` without one.

    The sample is printed with ``printf`` and ``args`` through the pipeline tail ``fmt``.
    """
    return fill(
        _QUERY_VALUE,
        {"query": query, "args": args, "fmt": fmt, "suffix": suffix, "unknown": unknown},
    )


def query_bytes(query: str, args: str) -> str:
    """Template text printing the first sample of a query as 1.5GiB, or "unknown"."""
    return query_value(query, args, "humanize1024", suffix="B")


def hosts(sel: str = RUN_SEL, args: str = RUN_ARGS) -> str:
    """Template text naming the host(s) of the alert's run, else its scrape address.

    The hosts are those the run's processes recorded (``trainguard_run_info``, on the alert's
    target): the first rank's first, then any other, joined by ", "; the ``instance`` (the
    scrape address, e.g. ``10.0.3.7:9636``) when no process of the run is known there, or it
    recorded no host. ``sel``/``args``: the run's (default) or the rank's
    (:data:`RANK_SEL`, :data:`RANK_ARGS`) selector and its printf arguments.
    """
    info = "trainguard_run_info{" + sel
    return (
        "{{ with printf `" + info + "}` " + args + ' | query | sortByLabel "rank" }}'
        "{{ with (first .).Labels.host }}{{ . }}"
        "{{ range printf `count by (${target_labels}, host) ("
        + info
        + ',host!=%q,host!=""})` '
        + args
        + " . "
        '| query | sortByLabel "host" }}, {{ .Labels.host }}{{ end }}'
        "{{ else }}{{ $labels.instance }}{{ end }}{{ else }}{{ $labels.instance }}{{ end }}"
    )


#: snippets every group's annotations may use: ``${run_host}`` (the run's host(s)) and
#: ``${rank_host}`` (the rank's), each falling back to the scrape address (:func:`hosts`)
COMMON_SNIPPETS = {"run_host": hosts(), "rank_host": hosts(RANK_SEL, RANK_ARGS)}

#: the step annotation of a run that reports none (a restarted run before its first step)
NO_STEP = "none reported yet"
#: steps at risk of a run that has steps and no complete primary checkpoint
NO_CHECKPOINT = "no complete checkpoint: everything since the start is at risk"

#: a snippet: the run's newest step over its ranks ("unknown" without one)
LAST_STEP = query_value("max(trainguard_run_step{" + RUN_SEL + "})", RUN_ARGS)

#: annotations of every alert about a run (Group.run_context): what on-call needs in the
#: notification whatever the alert (deploy/trainguard.tmpl prints them), its host included
RUN_CONTEXT = {
    "step": query_value("max(trainguard_run_step{" + RUN_SEL + "})", RUN_ARGS, unknown=NO_STEP),
    "checkpoint_step": query_value(
        "max(trainguard_checkpoint_last_step{" + RUN_SEL + ',location="primary"})',
        RUN_ARGS,
        unknown="none",
    ),
    # no complete primary checkpoint while the run has steps: everything is at risk, say so.
    # From the raw series, not run:trainguard_run_steps_since_checkpoint:max: at the first
    # evaluation after Prometheus starts, an alert's group may run before the recording
    # rules' has, and a record not evaluated yet read as "no checkpoint"
    "steps_at_risk": query_value(
        "clamp_min(max(trainguard_run_step{"
        + RUN_SEL
        + "}) - max(trainguard_checkpoint_last_step{"
        + RUN_SEL
        + ',location="primary"}), 0)',
        RUN_ARGS + " " + RUN_ARGS,  # the run's selector twice
        unknown="{{ with printf `max(trainguard_run_step{"
        + RUN_SEL
        + "})` "
        + RUN_ARGS
        + " | query }}"
        + NO_CHECKPOINT
        + "{{ else }}unknown{{ end }}",
    ),
    # where it runs, as the processes named their host (not the scrape address): the rank's
    # for an alert about one rank, else the run's
    "host": "{{ if $labels.rank }}"
    + hosts(RANK_SEL, RANK_ARGS)
    + "{{ else }}"
    + hosts()
    + "{{ end }}",
}
