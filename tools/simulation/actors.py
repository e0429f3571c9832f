"""The actors of a run: competing consumers, producer scripts, the change-feed publisher, the outbox sweeper, and
the other writers of the container (``simulation.foreign``)."""

from __future__ import annotations

import contextlib
import functools
from datetime import datetime

from idempotent_consumer.delivery import Settlement
from idempotent_consumer.errors import ConsumerError, NotFound
from idempotent_consumer.outcomes import Result
from simulation import foreign
from simulation.broker import Delivery, LockLost
from simulation.faults import SETTLE_FAULTS
from simulation.scheduler import EPOCH, Crash, drive
from simulation.workload import Send
from simulation.world import Instance, World

RESTART_SECONDS = (1.0, 10.0)  # how long a crashed process takes to come back
FEED_LATENCY_SECONDS = (0.5, 5.0)  # from a write to its change-feed batch
SWEEP_PERIOD_SECONDS = 120.0  # OUTBOX_SWEEP_SCHEDULE: every 2 minutes
OPERATOR_AFTER_SECONDS = 60.0  # an operator resubmits the RetryLimitExceeded dead letters this long after an outage
OPERATOR_PERIOD_SECONDS = 120.0  # and looks again this often


def start(world: World) -> None:
    """Spawn every actor of the run."""
    sched = world.sched
    for index in range(world.consumers):
        sched.spawn(f"consumer-{index + 1}", Consumer(world).run)
    for index, script in enumerate(world.workload.scripts):
        sched.spawn(f"producer-{index + 1}", Producer(world, script).run)
    sched.spawn("publisher", Publisher(world).run)
    sched.spawn("sweeper", Sweeper(world).run)
    if world.chaos.outage is not None and world.chaos.outage.long:
        sched.spawn("dlq-operator", Operator(world).run)
    foreign.start(world)


class Consumer:
    """A Functions instance: takes deliveries from either queue and runs each through the app's delivery
    policy (``idempotent_consumer.delivery.run_delivery``, the one the functions run), settling on the simulated broker.

    A crash ends the delivery unsettled (its lock runs out) and restarts the process, which holds no
    session any more.
    """

    def __init__(self, world: World) -> None:
        self.world = world

    def run(self) -> None:
        """Serve deliveries forever, restarting after each crash."""
        world, sched = self.world, self.world.sched
        while True:
            receiver, instance = world.broker.new_receiver(), world.instance()  # a process starts: its own breakers
            try:
                while True:
                    delivery = world.broker.receive(receiver)
                    if delivery is None:
                        sched.wait(world.broker.ready)
                    else:
                        self._deliver(delivery, instance)
            except Crash as crash:
                if sched.trace_lines is not None:
                    sched.trace(f"crashed at {crash}; restarting")
                sched.sleep(sched.rng.uniform(*RESTART_SECONDS))

    def _deliver(self, delivery: Delivery, instance: Instance) -> None:
        world, sched, message = self.world, self.world.sched, delivery.message
        world.busy += 1
        world.deliveries += 1
        if sched.current is not None:
            sched.current.subject = message.message_id or str(message)
        if sched.trace_lines is not None:
            sched.trace(f"receive {message} delivery {message.deliveries}")
        queue = delivery.queue.name
        order = message.session_id if delivery.queue is world.broker.events else None
        if order is not None:
            world.concurrent_events += world.events_in_flight[order] > 0
            world.events_in_flight[order] += 1
        world.in_hand[sched.current] = delivery
        try:
            # The shipped policy logged the refused settlement and raised it, as the function would for
            # the host; the broker redelivers once the lock is gone.
            with contextlib.suppress(LockLost):
                drive(instance.app.deliver(queue, functools.partial(delivery.inbound, world.clock),
                                           instance.handlers[queue], BrokerSettlement(world, delivery), queue=queue))
        finally:
            if order is not None:
                world.events_in_flight[order] -= 1
            world.in_hand.pop(sched.current, None)
            world.busy -= 1


class BrokerSettlement:
    """The settlement port of one simulated delivery: a chaos step, then the queue's settle call.

    A crash here ends the delivery unsettled; a lock that ran out or was taken over raises LockLost,
    counted, as the binding's call raises for a lost lock.
    """

    def __init__(self, world: World, delivery: Delivery) -> None:
        self.world = world
        self.delivery = delivery

    async def settle(self, settlement: Settlement, result: Result) -> None:
        """Settle the delivery on its queue; never suspends (the chaos step switches greenlets below it)."""
        world, sched = self.world, self.world.sched
        world.chaos.checkpoint(f"settle {settlement.action}", SETTLE_FAULTS)
        try:
            self.delivery.queue.settle(self.delivery, settlement.action, settlement.reason, result.description)
            if world.after_settle is not None:
                world.after_settle()
        except LockLost:
            world.settlements["lock_lost"] += 1
            if sched.trace_lines is not None:
                sched.trace(f"settle {settlement.action} refused: lock lost")
            raise
        world.settlements[settlement.action.value] += 1

    async def renew_session_lock(self) -> datetime | None:
        """Nothing to renew: the simulated broker renews a session's lock with each message it hands out,
        so a delivery's lock is its own (broker.py)."""
        return None


class Producer:
    """Sends one script's messages in order, each at its time; a send with ``after`` first waits for that
    message to be processed (it and every copy of it handed on settled) and for its detection window to pass."""

    def __init__(self, world: World, script: tuple[Send, ...]) -> None:
        self.world = world
        self.script = script

    def run(self) -> None:
        """Send the script, then stop."""
        world, sched = self.world, self.world.sched
        for send in self.script:
            earliest = EPOCH + send.at
            if send.after is not None:
                first = world.accepted[send.after]
                while not world.queue(first.queue).processed(first):
                    sched.wait(world.broker.settled)
                # The window runs from the last send under its MessageId: an operator's resubmission's, if any.
                queue = world.queue(first.queue)
                earliest = max(earliest, first.enqueued_at + world.detection_window + 1.0,
                               queue.detects_until(first.message_id) + 1.0)
            sched.sleep(earliest - world.clock.now)
            out = send.message
            sent = world.queue(out.queue).send(message_id=out.message_id, body=out.body, session_id=out.session_id,
                                               correlation_id=out.correlation_id, tag=out.tag,
                                               properties=dict(out.properties))
            if sent is not None:
                world.accepted[out.tag] = sent
            if sched.trace_lines is not None:
                sched.trace(f"send {out.label} {sent or f'{out.queue} {out.message_id}: dropped as a duplicate'}")
        world.producing -= 1


class Publisher:
    """publish_outbox: each change-feed batch of outbox entries, a little after the writes.

    A crash leaves the lease unchanged, so the same batch comes again; a batch that ran is not
    retried (entries it could not send stay pending for the sweep), as with the real change feed.
    """

    def __init__(self, world: World) -> None:
        self.world = world

    def run(self) -> None:
        """Publish change-feed batches forever."""
        world, sched = self.world, self.world.sched
        while True:
            while not world.history.outbox_changes:
                sched.wait(world.feed)
            sched.sleep(sched.rng.uniform(*FEED_LATENCY_SECONDS))
            batch = world.history.take_outbox_changes()
            documents = []
            for order_id, doc_id in batch:
                try:
                    documents.append(drive(world.store.read(doc_id, order_id)))
                except NotFound:
                    continue
            world.busy += 1
            try:
                drive(world.outbox.publish(documents))
            except Crash:
                for key in batch:
                    world.history.outbox_changes.setdefault(key)
                sched.sleep(sched.rng.uniform(*RESTART_SECONDS))
            except Exception as exc:  # the host logs a failed invocation; the feed moves on
                _failed(world, exc)
            finally:
                world.busy -= 1


class Sweeper:
    """sweep_outbox on its timer: publishes entries still pending after OUTBOX_STUCK_AFTER_SECONDS."""

    def __init__(self, world: World) -> None:
        self.world = world

    def run(self) -> None:
        """Sweep every period, forever."""
        world, sched = self.world, self.world.sched
        while True:
            sched.sleep(SWEEP_PERIOD_SECONDS - world.clock.elapsed() % SWEEP_PERIOD_SECONDS)
            world.busy += 1
            try:
                drive(world.outbox.sweep(stuck_after_seconds=world.settings.outbox_stuck_after_seconds))
            except Crash:
                continue
            except Exception as exc:  # the host logs a failed invocation; the timer fires again
                _failed(world, exc)
            finally:
                world.busy -= 1


class Operator:
    """The operator in a long outage (docs/operations.md, "In an outage"): once the dependency is back, resubmit
    what the total limit dead-lettered RetryLimitExceeded, as ``sbctl dlq resubmit --reason RetryLimitExceeded``
    does (under the original MessageId, without the chain's properties); then look again now and then."""

    def __init__(self, world: World) -> None:
        self.world = world

    def run(self) -> None:
        """Wait for the outage's end, then resubmit every OPERATOR_PERIOD_SECONDS, forever."""
        world, sched = self.world, self.world.sched
        outage = world.chaos.outage
        assert outage is not None
        sched.sleep(max(0.0, outage.end + OPERATOR_AFTER_SECONDS - world.clock.now))
        while True:
            for queue, dead in world.to_resubmit():
                again = queue.resubmit(dead)
                world.resubmitted += again is not None
                if sched.trace_lines is not None:
                    sched.trace(f"operator resubmits {dead} as {again}")
            sched.sleep(OPERATOR_PERIOD_SECONDS)


def _failed(world: World, error: Exception) -> None:
    """A publisher or sweeper invocation failed: the host logs it and the feed or timer goes on. A port's
    error is expected under chaos; anything else (a coroutine that suspended, say) is a bug of the run."""
    world.settlements["invocation_failed"] += 1
    if not isinstance(error, ConsumerError):
        world.errors.append(f"{type(error).__name__} in an outbox invocation: {error}")
    if world.sched.trace_lines is not None:
        world.sched.trace(f"invocation failed: {type(error).__name__}: {error}")
