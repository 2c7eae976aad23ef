"""Known failures of main, switched off until their fixes land.

Each flag turns off one behaviour of the model-based test (a rule, or the cases of an
invariant that one open bug breaks), so the test keeps guarding everything else in CI. Each
finding (F-number, from the review of issue 10) is described at its flag with the issue
item it waits for.
Delete a flag when its fix lands (and the test passes without it).

``ONWARD_MODEL_KNOWN=check`` ignores every flag: the test then checks everything, to see
whether the known failures still fail.
"""

from __future__ import annotations

import os

CHECK_EVERYTHING = os.environ.get("ONWARD_MODEL_KNOWN", "") == "check"

# F7 (issue 10 item 7, a design question): a model call whose answer is lost on the way
# (billed by the provider, never heard by the worker) is not debited, so a run can spend
# one call more than its budget per lost answer. Off: the budget check counts the calls
# whose answers reached the worker (all answers heard are debited, NUL ones included).
LOST_MODEL_ANSWERS_UNCOUNTED = not CHECK_EVERYTHING

# F9 (issue 10 items 7 and 12): a model answer the ledger cannot keep (a NUL) is debited and
# then the run is failed, in two statements; a crash between them makes the next attempt
# ask (and pay) again. Off: a delivery whose model answers with a NUL does not crash.
NO_CRASH_AFTER_NUL_ANSWERS = not CHECK_EVERYTHING
