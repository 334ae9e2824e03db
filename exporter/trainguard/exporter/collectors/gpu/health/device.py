"""One GPU's health reads and their sample lines, at a fraction of pynvml's and add_metric's cost.

Why: with about 20 health series a GPU, what costs in a scrape is Python per series, not the NVML
calls (bench/RESULTS.md measures it), so per series this does as little as it can:

- NVML's functions are called through ctypes with out-parameters made once per GPU (pynvml's
  wrappers make new ctypes objects, look the function up under a lock and raise per call);
- each series' line up to its value (name and labels) is rendered once per GPU, and its line
  again only when its value changed; the lines go to the page as they are
  (:class:`~trainguard.exporter.scrape.exposition.LineFamily`);
- what changes slowly or never (ECC counts, remapped rows or retired pages, NVLink error
  counters, the link's maxima, the slowdown temperature, the enforced power limit) is read every
  :data:`SLOW_READ_S` at most, and published from the last read in between, so no value is
  older than that (a read that failed is tried again at the next scrape); ECC counts, remapped
  rows and retired pages in one ``nvmlDeviceGetFieldValues`` call, each value the driver does
  not answer there by its own call (``fields.py``).

A read the GPU does not support (``NOT_SUPPORTED``) or the driver does not have
(``FUNCTION_NOT_FOUND``) gives no series (unknown, never zero) and is not tried again for
:data:`RECHECK_UNSUPPORTED_S`.
"""

from __future__ import annotations

import ctypes
from functools import partial
from typing import Any

import pynvml

from trainguard.exporter.collectors.gpu import metrics as hm
from trainguard.exporter.collectors.gpu.health import fields as fi
from trainguard.exporter.collectors.gpu.health.lines import Out, Slot, put, update
from trainguard.exporter.collectors.gpu.health.nvml import (
    MAX_NVLINKS,
    NVLINK_COUNTERS,
    RETIREMENT_CAUSES,
    Functions,
)
from trainguard.exporter.scrape.context import Scrape
from trainguard.exporter.scrape.exposition import sample_prefix

#: seconds before a read that was not supported is tried again (a GPU whose MIG mode was
#: switched off supports utilisation again)
RECHECK_UNSUPPORTED_S = 600.0
#: seconds between two reads of what changes slowly or never: the oldest a published ECC
#: count, remapped-row or retired-page state or NVLink error count can be
SLOW_READ_S = 30.0

_SUCCESS = pynvml.NVML_SUCCESS
_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
_INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
_UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
_INDEX = {spec.name: i for i, spec in enumerate(hm.HEALTH)}
#: the reads made at every scrape, in the order they are made
PER_SCRAPE = (
    "clock event reasons",
    "PCIe link generation",
    "PCIe link width",
    "power usage",
    "utilisation",
    "temperature",
)
_ALL_READ = (True,) * len(PER_SCRAPE)
_SCALE = {hm.POWER_LIMIT.name: 1000.0}  # milliwatts


class DeviceHealth:
    """One GPU's reads, its series' rendered lines, and what it does not support.

    Made afresh when NVML starts afresh (a new handle): nothing is kept across a restart.
    """

    def __init__(self, index: str, uuid: str, handle: Any, fns: Functions) -> None:
        self.index, self.uuid, self.handle = index, uuid, handle
        self._fns = fns
        self._labels = {"gpu": index, "uuid": uuid}
        #: (series, key) -> its slot
        self._slots: dict[object, Slot] = {}
        self._reason_slots: dict[int, list[Slot]] = {}  # mask -> its reasons' slots
        self._unsupported: dict[str, float] = {}  # read -> when it was last not supported
        self._slow_due = 0.0
        #: the slow reads' samples (series' index, line, row), published until the next read
        self.slow: list[tuple[int, str, tuple[dict[str, str], float]]] = []
        self.slow_version = 0  # bumped whenever ``slow`` is replaced
        self._pending: list[tuple[int, str, tuple[dict[str, str], float]]] = []
        self._u = ctypes.c_uint()
        self._ull = ctypes.c_ulonglong()
        self._util = pynvml.c_nvmlUtilization_t()
        self._rows = [ctypes.c_uint() for _ in range(4)]
        # one out-parameter per read made at every scrape: the six are made, then looked at
        self._gen, self._width = ctypes.c_uint(), ctypes.c_uint()
        self._power, self._temperature = ctypes.c_uint(), ctypes.c_uint()
        self._u_ref = ctypes.byref(self._u)
        self._util_ref = ctypes.byref(self._util)
        self._ull_ref = ctypes.byref(self._ull)
        ref, reasons = ctypes.byref, fns.reasons if fns.new_reasons else fns.throttle_reasons
        #: the reads of PER_SCRAPE, each a call of NVML's with its out-parameter bound
        self._calls = [
            partial(reasons, handle, self._ull_ref),
            partial(fns.pcie_gen, handle, ref(self._gen)),
            partial(fns.pcie_width, handle, ref(self._width)),
            partial(fns.power, handle, ref(self._power)),
            partial(fns.utilization, handle, self._util_ref),
            partial(fns.temperature, handle, _TEMPERATURE_GPU, ref(self._temperature)),
        ]
        slot = self._slot
        self._mask_slot = slot(hm.CLOCK_EVENT_REASONS.name, "mask")
        self._gen_slot = slot(hm.PCIE_GENERATION.name)
        self._width_slot = slot(hm.PCIE_WIDTH.name)
        self._power_slot = slot(hm.POWER.name)
        self._util_slot = slot(hm.UTILIZATION.name)
        self._temperature_slot = slot(hm.TEMPERATURE.name)
        self._fields = fi.SlowFields()
        self._lost = False
        self._fast = True  # no read of PER_SCRAPE is skipped as not supported
        self._scrape: Scrape | None = None
        self._now = 0.0

    @property
    def lost(self) -> bool:
        """The GPU answered GPU_IS_LOST in this scrape: its slow series are not served."""
        return self._lost

    def collect(self, out: Out, scrape: Scrape, now: float) -> None:
        """Read this GPU's health into ``out``; a failed read is reported on ``scrape``.

        The slow reads are made here when due, and left in :attr:`slow` for the caller to
        serve (they are the same from one scrape to the next, and so is what it makes of them).
        """
        self._scrape, self._now, self._lost = scrape, now, False
        if self._fast:  # all six made, then looked at: one test when all succeed
            rcs: list[int | None] = [call() for call in self._calls]
            read = self._settle(rcs) if any(rcs) else _ALL_READ
        else:
            skip = self._skip
            reads = zip(PER_SCRAPE, self._calls, strict=True)
            read = self._settle([None if skip(what) else call() for what, call in reads])
        self._publish(out, read)
        if not self._lost and now >= self._slow_due:
            self._read_slow()

    def _settle(self, rcs: list[int | None]) -> tuple[bool, ...]:
        """Which reads of PER_SCRAPE succeeded; the others noted as unsupported or reported.

        Nothing after the GPU was lost counts (and only the first error says so).
        """
        fns, calls = self._fns, self._calls
        if rcs[0] == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and calls[0].func is fns.reasons:
            # a driver before R535: the older name, the same bits (for the GPUs made later too)
            fns.new_reasons = False
            calls[0] = partial(fns.throttle_reasons, self.handle, self._ull_ref)
            rcs[0] = calls[0]()
        read = tuple(
            rc is not None and not self._lost and self._ok(what, rc)
            for what, rc in zip(PER_SCRAPE, rcs, strict=True)
        )
        unsupported = self._unsupported
        self._fast = not any(what in unsupported for what in PER_SCRAPE)
        return read

    def _publish(self, out: Out, read: tuple[bool, ...]) -> None:
        """The samples of the reads of PER_SCRAPE that succeeded into ``out``."""
        lines, rows = out.lines, out.rows
        if read[0]:
            mask = self._ull.value
            put(lines, rows, self._mask_slot, mask, 1.0)
            slots = self._reason_slots.get(mask)
            for slot in self._reasons_of(mask) if slots is None else slots:
                put(lines, rows, slot, 1, 1.0)
        if read[1]:
            put(lines, rows, self._gen_slot, self._gen.value, 1.0)
        if read[2]:
            put(lines, rows, self._width_slot, self._width.value, 1.0)
        if read[3]:
            put(lines, rows, self._power_slot, self._power.value, 1000.0)
        if read[4]:
            put(lines, rows, self._util_slot, self._util.gpu, 100.0)
        if read[5]:
            put(lines, rows, self._temperature_slot, self._temperature.value, 1.0)

    def _reasons_of(self, mask: int) -> list[Slot]:
        """The slots of the reasons ``mask`` gives (kept: a GPU goes through few masks)."""
        if len(self._reason_slots) >= 64:
            self._reason_slots.clear()
        name = hm.CLOCK_EVENT_REASON.name
        slots = [self._slot(name, r, {"reason": r}) for r in hm.reason_labels(mask)]
        self._reason_slots[mask] = slots
        return slots

    def _ok(self, what: str, rc: int) -> bool:
        """True when ``rc`` is success; else note the read as unsupported or report it."""
        if rc == _SUCCESS:
            if self._unsupported:
                self._unsupported.pop(what, None)
            return True
        if rc in _UNSUPPORTED:
            self._unsupported[what] = self._now
        elif not self._lost:
            self._lost = rc == _LOST
            assert self._scrape is not None
            self._scrape.error(f"GPU {self.index} ({self.uuid}): {what}: {pynvml.NVMLError(rc)}")
        return False

    def _found(self, what: str) -> None:
        """``what`` was read (here or from a field value): supported again."""
        if self._unsupported:
            self._unsupported.pop(what, None)

    def _skip(self, what: str) -> bool:
        """Not read now: the GPU is lost, or did not support it a short while ago."""
        if self._lost:
            return True
        seen = self._unsupported.get(what)
        return seen is not None and self._now - seen < RECHECK_UNSUPPORTED_S

    def _emit(
        self,
        out: Out | None,
        name: str,
        key: object,
        extra: dict[str, str] | None,
        raw: int,
        scale: float,
    ) -> None:
        """One sample: ``raw / scale`` under this GPU's labels plus ``extra``.

        Into ``out``, or into the slow reads' list when ``out`` is None.
        """
        slot = self._slot(name, key, extra)
        if out is not None:
            put(out.lines, out.rows, slot, raw, scale)
            return
        update(slot, raw, scale)
        self._pending.append((slot.index, slot.line, slot.row))

    def _slot(self, name: str, key: object = None, extra: dict[str, str] | None = None) -> Slot:
        """The slot of series ``name`` (``key`` tells apart its series of this GPU)."""
        slot = self._slots.get((name, key))
        if slot is None:
            labels = {**self._labels, **extra} if extra else self._labels
            prefix = sample_prefix(name, labels)
            slot = self._slots[(name, key)] = Slot(prefix, labels, _INDEX[name])
        return slot

    def _read_slow(self) -> None:
        """Read what changes slowly or never into :attr:`slow`; due again in SLOW_READ_S."""
        fns, h, u, uref = self._fns, self.handle, self._u, self._u_ref
        self._pending = []
        errors = len(self._scrape.errors) if self._scrape else 0
        fields = self._fields.read(fns.field_values, h)
        for spec, what, read in (
            (hm.PCIE_GENERATION_MAX, "PCIe max link generation", lambda: fns.pcie_max_gen(h, uref)),
            (
                hm.PCIE_GENERATION_GPU_MAX,
                "GPU max PCIe generation",
                lambda: fns.pcie_gpu_max_gen(h, uref),
            ),
            (hm.PCIE_WIDTH_MAX, "PCIe max link width", lambda: fns.pcie_max_width(h, uref)),
            (hm.POWER_LIMIT, "enforced power limit", lambda: fns.power_limit(h, uref)),
            (
                hm.TEMPERATURE_SLOWDOWN,
                "slowdown temperature",
                lambda: fns.threshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, uref),
            ),
        ):
            if not self._skip(what) and self._ok(what, read()):
                self._emit(None, spec.name, None, None, u.value, _SCALE.get(spec.name, 1.0))
        for spec, what, kind, field in (
            (
                hm.ECC_CORRECTED,
                "corrected ECC errors",
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                fi.ECC_SBE_VOL_TOTAL,
            ),
            (
                hm.ECC_UNCORRECTED,
                "uncorrected ECC errors",
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                fi.ECC_DBE_VOL_TOTAL,
            ),
        ):
            if self._skip(what):
                continue
            count = fields.get(field)
            if count is None and self._ok(
                what, fns.ecc(h, kind, pynvml.NVML_VOLATILE_ECC, self._ull_ref)
            ):
                count = self._ull.value
            if count is not None:
                self._found(what)
                self._emit(None, spec.name, None, None, count, 1.0)
        self._read_memory_retirement(fields)
        self._read_nvlinks()
        self.slow = self._pending
        self.slow_version += 1
        if self._scrape is None or len(self._scrape.errors) == errors:
            self._slow_due = self._now + SLOW_READ_S  # else: tried again at the next scrape

    def _read_memory_retirement(self, fields: dict[int, int]) -> None:
        """Remapped rows (Ampere and later) or retired pages (before): whichever the GPU has.

        From ``fields`` (this slow read's field values) where they answered, else each by its
        own call.
        """
        fns, h = self._fns, self.handle
        rows = self._rows
        answered = [fields[f] for f in fi.REMAPPED if f in fields]
        remapped: list[int] | None = answered if len(answered) == 4 else None
        if self._skip("remapped rows"):
            remapped = None
        elif remapped is None and self._ok(
            "remapped rows", fns.remapped(h, *(ctypes.byref(r) for r in rows))
        ):
            remapped = [r.value for r in rows]
        if remapped is not None:
            self._found("remapped rows")
            corrected, uncorrected, pending, failed = remapped
            emit, name = self._emit, hm.REMAPPED_ROWS.name
            emit(None, name, "correctable", {"cause": "correctable"}, corrected, 1.0)
            emit(None, name, "uncorrectable", {"cause": "uncorrectable"}, uncorrected, 1.0)
            emit(None, hm.ROW_REMAP_PENDING.name, None, None, 1 if pending else 0, 1.0)
            emit(None, hm.ROW_REMAP_FAILED.name, None, None, 1 if failed else 0, 1.0)
        if self._skip("retired pages"):
            return
        count = self._u
        counts = []
        for (cause, label), field in zip(
            RETIREMENT_CAUSES, (fi.RETIRED_SBE, fi.RETIRED_DBE), strict=True
        ):
            n = fields.get(field)
            if n is None:
                count.value = 0  # asks the count alone (INSUFFICIENT_SIZE with it when not 0)
                rc = fns.retired(h, cause, self._u_ref, None)
                if not self._ok("retired pages", _SUCCESS if rc == _INSUFFICIENT_SIZE else rc):
                    return
                n = count.value
            counts.append((cause, label, n))
        self._found("retired pages")
        for cause, label, n in counts:
            self._emit(None, hm.RETIRED_PAGES.name, cause, {"cause": label}, n, 1.0)
        what = "retired pages pending"
        if self._skip(what):
            return
        flag = fields.get(fi.RETIRED_PENDING)
        if flag is None and self._ok(what, fns.retired_pending(h, self._u_ref)):
            flag = self._u.value
        if flag is not None:
            self._found(what)
            pending = 1 if flag else 0
            self._emit(None, hm.RETIRED_PAGES_PENDING.name, None, None, pending, 1.0)

    def _read_nvlinks(self) -> None:
        """Each error counter of each active NVLink link, up to the first link the GPU lacks."""
        if self._skip("NVLink state"):
            return
        fns, h, u, ull = self._fns, self.handle, self._u, self._ull
        name = hm.NVLINK_ERRORS.name
        for link in range(MAX_NVLINKS):
            rc = fns.nvlink_state(h, link, self._u_ref)
            if rc == _INVALID_ARGUMENT or (rc in _UNSUPPORTED and link):
                return  # past the GPU's links
            if not self._ok("NVLink state", rc):
                return  # link 0 not supported: a GPU without NVLink
            if not u.value:
                continue  # an inactive link: its counters say nothing
            for counter, label in NVLINK_COUNTERS:
                what = f"NVLink {label} errors"
                if self._skip(what):
                    continue
                rc = fns.nvlink_errors(h, link, counter, self._ull_ref)
                if self._ok(what, rc):
                    extra = {"link": str(link), "error": label}
                    self._emit(None, name, (link, counter), extra, ull.value, 1.0)
                elif self._lost:
                    return
