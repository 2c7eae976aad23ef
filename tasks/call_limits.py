"""Fleet-wide limits and retry policies around a model call, a read or an effect's call
(docs/limits.md): a slot of each limit, or a wait in its queue without a worker; a
retryable failure deferred while its policy has attempts left, counted in the ledger."""

from __future__ import annotations

from collections.abc import Callable

from ledger.vocabulary import WaitKind
from tasks.control import Suspend, WaitFor
from tasks.limits import Limit, LimitScope
from tasks.retry import RetryPolicy, classify, retry_after_s
from tasks.scope import StepScope, T, call_error, log

__all__ = ["CallLimits"]


class CallLimits(StepScope):
    """Limits and retries of one step's calls."""

    def _limited_call(self, limits: tuple[Limit, ...], policy: RetryPolicy, target: str,
                      command_id: str, timeout_s: float, call: Callable[[], T]) -> T:
        """Make a model call or a read: within a slot of each of ``limits`` (or wait for
        one without a worker), its retryable failures deferred per ``policy``."""
        held = self._acquire(limits, target, command_id, timeout_s)
        try:
            return call()
        except Exception as exc:
            self._retry_later(policy, command_id, exc, target)
            raise
        finally:
            self._release(held, command_id)

    def _acquire(self, limits: tuple[Limit, ...], target: str, command_id: str,
                 timeout_s: float) -> list[str]:
        """A slot of each limit for this call; the keys held. When one is not free, give
        back those taken and wait in its queue (the step is deferred: no worker, no lease,
        no attempt spent), woken when a slot frees or after ``retry_in_s``."""
        held: list[str] = []
        scope = LimitScope(self.tenant_id, target)
        for limit in limits:
            key = limit.key(scope)
            grant = self.limits.acquire(
                key, limit.name, concurrency=limit.concurrency, rate=limit.rate_window,
                run_id=self.run_id, seq=self.seq, command_id=command_id, epoch=self.epoch,
                rank=self.priority.rank, hold_s=timeout_s + self.lease_margin_s,
                wait_s=self.limit_poll_s)
            if not grant.granted:
                self._release(held, command_id)
                self.control.wait(WaitFor(
                    grant.retry_in_s, f"{WaitKind.LIMIT.value}:{key}",
                    f"{target}: limit {key} full ({grant.in_use} in flight, "
                    f"{grant.waiting} waiting); asking again in {grant.retry_in_s:.2f}s "
                    "or when a slot frees"))
                raise Suspend()
            held.append(key)
        return held

    def _release(self, held: list[str], command_id: str) -> None:
        for key in held:
            try:
                self.limits.release(key, run_id=self.run_id, command_id=command_id,
                                    epoch=self.epoch)
            except Exception as exc:  # the slot expires with the call's cover instead
                log.warning("could not give a limit's slot back", key=key, error=str(exc))
        held.clear()

    def _retry_later(self, policy: RetryPolicy, command_id: str, exc: Exception,
                     target: str) -> None:
        """Defer the step to retry the call, when ``policy`` retries this failure and
        attempts are left (counted in the ledger); otherwise return and let it raise."""
        failure = classify(exc)
        if not policy.retries(failure) or policy.attempts <= 1:
            return
        error = {**call_error(exc), "failure": str(failure)}
        failures = self.retries.count_failure(self.run_id, self.seq, command_id,
                                              epoch=self.epoch, error=error,
                                              tenant_id=self.tenant_id)
        if failures is None or failures >= policy.attempts:
            return  # the lease is lost, or the call's attempts are spent: the error stands
        delay = policy.delay_s(failures, retry_after_s(exc))
        self.control.wait(WaitFor(
            delay, f"{WaitKind.RETRY.value}:{command_id}",
            f"{target} failed ({failure}, {failures} of {policy.attempts} attempts): "
            f"retrying in {delay:.2f}s"))
        raise Suspend() from exc
