"""What the checkpoint stores, with one meaning on every model (issue 35): every learned parameter the release's
checkpoint holds, tied tensors once, the multi-token-prediction layers included wherever the config declares them,
counted apart from the main model (from the config, with the family's own formula, where transformers does not
build them: ModelSpec.declared_mtp); and the stored buffers and bytes beside them."""

from __future__ import annotations

from collections.abc import Iterable

from explorer.checkpoint.reconcile import Reconciliation
from explorer.model.account import ComponentAccount, Ledger
from explorer.model.components.part_facts import facts
from explorer.spec.types import ModelSpec, path_key, walk

STORED_DEFINITION = ("Parameters stored: every learned parameter the release's checkpoint holds, tied tensors once, the "
                     "multi-token-prediction layers included wherever the config declares them (counted apart, and "
                     "from the config with the family's own formula where transformers does not build them).")
"""What "stored" means, the same on every model: stated once wherever the figure appears (the model page's figures,
the index and the API)."""


def stored_buffers(ledger: Ledger, stored: Reconciliation | None) -> tuple[int, str]:
    """(elements, formula) of the buffers stored: the checkpoint ledger's where a listing is recorded (Kimi K2's
    61 rotary tables, which another checkpoint may omit), else those every checkpoint of the spec stores."""
    if stored is not None:
        return stored.role_total("buffer")[1], "sum of the checkpoint ledger's stored buffers"
    return (_buffer_elements(ledger.accounts.values(), 1) + _buffer_elements(ledger.declared.values(),
                                                                             _declared_count(ledger)),
            "sum of the ledger's stored buffers (those a checkpoint may omit left out)")


def _buffer_elements(accounts: Iterable[ComponentAccount], modules: int) -> int:
    """Elements of every persistent buffer the checkpoint stores (optional ones, which a checkpoint may omit, left
    out), each counted once per instance, `modules` times (a declared MTP module's tensors name one module)."""
    return modules * sum(ta.spec.count * st.elements for acc in accounts for ta in acc.tensors
                         for st in ta.stored if st.role == "buffer" and not ta.spec.optional)


def stored_bytes(ledger: Ledger, stored: Reconciliation | None) -> int:
    if stored is not None:
        return sum(t.bytes for t in stored.totals)
    return _tensor_bytes(ledger.accounts.values(), 1) + _tensor_bytes(ledger.declared.values(), _declared_count(ledger))


def _tensor_bytes(accounts: Iterable[ComponentAccount], modules: int) -> int:
    """Bytes of the accounts' stored tensors, `modules` times (a declared MTP module's tensors name one module)."""
    return modules * sum(ta.spec.count * st.nbytes for acc in accounts for ta in acc.tensors
                         for st in ta.stored if (st.role != "buffer" or not ta.spec.optional)  # stored buffers count
                         and not ta.spec.tied_to)  # a tied head is stored once


def _declared_count(ledger: Ledger) -> int:
    """How many declared MTP modules the ledger's declared accounts stand for."""
    return ledger.declared["mtp"].instances if ledger.declared else 0


def mtp_parameters(spec: ModelSpec, ledger: Ledger) -> int:
    """Parameters of the multi-token-prediction layers the checkpoint stores: a module the tree describes (DeepSeek-V3)
    and those the config declares that the reference does not build (ModelSpec.declared_mtp)."""
    return sum(ledger.accounts[p].total for p, c in ((path_key(a, c), c) for a, c in walk(spec.root)) if facts(c.program).mtp) + ledger.declared_mtp
