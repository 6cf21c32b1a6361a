//! The deadlines of one HTTP/1.1 connection, after its TLS handshake: how long it may wait for
//! the first byte of a request (`idle`), for the rest of that request's headers (`header_read`),
//! and for its body (`body_read`). Whichever passes first closes the connection.
//!
//! hyper 1.x has a header-read timer, but it starts when the connection becomes ready for a
//! request and ends with the request's headers: one window for the quiet time between requests
//! and the headers together, and nothing for the body. The three waits are told apart here, each
//! with its own setting and its own count when it fires.
//!
//! And how long the connection may live: it is closed once idle after `max_connection_age_ms`
//! (less a random tenth, so that connections made together do not all close together), at once
//! when its client certificate's `notAfter` passes, and at once when a reload of the TLS files
//! no longer accepts the certificate it was opened with ([`Activity::revoke`]): a certificate
//! revoked or expired keeps no connection it already had.
//!
//! Every change of phase happens inside the connection's own poll (a read from the socket, hyper
//! calling the service, the service reading its body, the service's future finishing), so the
//! [`Guarded`] future around the connection reads the phase after each poll of it and keeps one
//! timer armed at the current deadline. Nothing wakes the task for a change of phase: a wake from
//! inside the connection's poll would send it round the scheduler once more per request (see
//! `repoll`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::LimitsSection;

/// The deadline that closed a connection (the `deadline` label of
/// `idgen_connections_timed_out_total`; the TLS handshake's is `handshake`, in `serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    Idle,
    HeaderRead,
    BodyRead,
    /// Idle past `max_connection_age_ms`, or past it and a request's header and body deadlines
    /// in any phase.
    MaxAge,
    /// The client certificate's `notAfter` passed.
    CertificateExpired,
    /// A reload of the TLS files no longer accepts the client certificate.
    Revoked,
}

impl Deadline {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Deadline::Idle => "idle",
            Deadline::HeaderRead => "header_read",
            Deadline::BodyRead => "body_read",
            Deadline::MaxAge => "max_age",
            Deadline::CertificateExpired => "certificate_expired",
            Deadline::Revoked => "revoked",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first byte of a request, since the connection opened or its last
    /// response was written.
    Idle { since: Instant },
    /// A request's first bytes have come, its headers are not complete.
    Head { since: Instant },
    /// The service has the request; its body (if it has one still coming) must end by then.
    Request { body_due: Option<Instant> },
}

/// A [`Phase`] in one word: its kind in the top two bits, its time below them (nanoseconds since
/// the connection opened: 2^62 ns is 146 years).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed(u64);

const KIND_SHIFT: u32 = 62;
const TIME_MASK: u64 = (1 << KIND_SHIFT) - 1;
const IDLE: u64 = 0;
const HEAD: u64 = 1;
const BODY_DUE: u64 = 2;
const WORKING: u64 = 3;

impl Packed {
    fn new(kind: u64, nanos: u64) -> Packed {
        Packed(kind << KIND_SHIFT | nanos.min(TIME_MASK))
    }

    fn kind(self) -> u64 {
        self.0 >> KIND_SHIFT
    }

    fn unpack(self, opened: Instant) -> Phase {
        let at = opened + Duration::from_nanos(self.0 & TIME_MASK);
        match self.kind() {
            IDLE => Phase::Idle { since: at },
            HEAD => Phase::Head { since: at },
            BODY_DUE => Phase::Request { body_due: Some(at) },
            _ => Phase::Request { body_due: None },
        }
    }
}

/// What one connection is waiting for, shared by the socket wrapper, the service wrapper and the
/// request bodies. Only the connection's own task changes its phase (a body moved to another task
/// only ends its deadline, with one compare-and-swap), so every change of phase is a plain store:
/// no lock on the request path, and one read of the coarse clock ([`coarse_now`]) per poll of the
/// connection rather than a full clock read per change of phase.
pub(crate) struct Activity {
    /// The [`Phase`], packed.
    phase: AtomicU64,
    /// When the connection's current poll began (nanoseconds since `opened`, as of the kernel's
    /// last tick: [`coarse_now`]): the time every change of phase during that poll takes. A poll
    /// lasts microseconds; a deadline counted from its start is that much earlier, never later.
    polled_at: AtomicU64,
    opened: Instant,
    /// Requests started, so that the body of one request cannot end the body deadline of the next.
    requests: AtomicU64,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    /// Closed once idle from then on (`max_connection_age_ms`, less a random tenth).
    retire_at: Instant,
    /// Closed from then on in any phase: a peer that never lets the connection idle (pipelined
    /// requests) keeps it no longer than its age and the header and body deadlines, which a
    /// request under way at `retire_at` has to finish in.
    retire_by: Instant,
    /// Closed at once from then on, in any phase (the client certificate's `notAfter`).
    end_at: Option<Instant>,
    /// Set by a reload that no longer accepts the connection's certificate; `wake` then wakes
    /// the connection's task, which closes it before polling it again. Only a connection with a
    /// client certificate registers a waker (`revocable`).
    revoked: AtomicBool,
    revocable: bool,
    wake: atomic_waker::AtomicWaker,
}

impl Activity {
    /// `end_at`: when the connection's client certificate expires; `revocable`: whether it has
    /// one (a reload may then revoke the connection).
    pub(crate) fn new(limits: &LimitsSection, end_at: Option<Instant>, revocable: bool) -> Arc<Activity> {
        let now = Instant::now();
        let age = limits.max_connection_age();
        let jitter = age.mul_f64(rand::random::<f64>() / 10.0);
        Arc::new(Activity {
            phase: AtomicU64::new(Packed::new(IDLE, 0).0),
            polled_at: AtomicU64::new(0),
            opened: now,
            requests: AtomicU64::new(0),
            idle_timeout: limits.idle_timeout(),
            header_read_timeout: limits.header_read_timeout(),
            body_read_timeout: limits.body_read_timeout(),
            retire_at: now + (age - jitter),
            retire_by: now + (age - jitter) + limits.header_read_timeout() + limits.body_read_timeout(),
            end_at,
            revoked: AtomicBool::new(false),
            revocable,
            wake: atomic_waker::AtomicWaker::new(),
        })
    }

    /// Closes the connection at its task's next turn, whatever it is doing: its certificate is
    /// no longer accepted. No request it sends from here on reaches a handler.
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        self.wake.wake();
    }

    /// What closes the connection now, before it is polled again.
    fn ended(&self, now: Instant) -> Option<Deadline> {
        if self.revocable && self.revoked.load(Ordering::Acquire) {
            return Some(Deadline::Revoked);
        }
        match self.end_at {
            Some(end) if end <= now => Some(Deadline::CertificateExpired),
            _ if self.retire_by <= now => Some(Deadline::MaxAge),
            _ => None,
        }
    }

    /// A poll of the connection begins at `now`.
    fn polling(&self, now: Instant) {
        self.polled_at.store(nanos_between(self.opened, now), Ordering::Relaxed);
    }

    fn phase(&self) -> Phase {
        Packed(self.phase.load(Ordering::Relaxed)).unpack(self.opened)
    }

    fn set(&self, kind: u64, nanos: u64) {
        self.phase.store(Packed::new(kind, nanos).0, Ordering::Relaxed);
    }

    /// Bytes came from the peer.
    fn read_some(&self) {
        if Packed(self.phase.load(Ordering::Relaxed)).kind() == IDLE {
            self.set(HEAD, self.polled_at.load(Ordering::Relaxed));
        }
    }

    /// hyper hands the service a request whose headers are complete: its body, if any is still
    /// to come, is due within the body deadline.
    pub(crate) fn request_body(self: &Arc<Self>, body: Incoming) -> RequestBody {
        // Only this connection's task starts requests: a load and a store, not a locked add.
        let number = self.requests.load(Ordering::Relaxed) + 1;
        self.requests.store(number, Ordering::Relaxed);
        if body.is_end_stream() {
            self.set(WORKING, 0);
            return RequestBody { inner: body, open: None };
        }
        let due = self.polled_at.load(Ordering::Relaxed).saturating_add(duration_nanos(self.body_read_timeout));
        self.set(BODY_DUE, due);
        RequestBody { inner: body, open: Some((self.clone(), number)) }
    }

    fn body_ended(&self, number: u64) {
        if self.requests.load(Ordering::Relaxed) != number {
            return;
        }
        let current = self.phase.load(Ordering::Relaxed);
        if Packed(current).kind() == BODY_DUE {
            // A compare-and-swap: the body may have been moved to another task, and the
            // connection may be past this request already.
            let _ =
                self.phase.compare_exchange(current, Packed::new(WORKING, 0).0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The service has answered: hyper writes the response, then waits for the next request.
    pub(crate) fn response_ready(&self) {
        self.set(IDLE, self.polled_at.load(Ordering::Relaxed));
    }

    /// The deadline in force: the phase's, but never past `retire_by` (nor the certificate's
    /// expiry), so that even a connection the service is working on has one.
    fn deadline(&self) -> (Instant, Deadline) {
        let phase = match self.phase() {
            Phase::Idle { since } => {
                let idle = since + self.idle_timeout;
                Some(if self.retire_at < idle { (self.retire_at, Deadline::MaxAge) } else { (idle, Deadline::Idle) })
            }
            Phase::Head { since } => Some((since + self.header_read_timeout, Deadline::HeaderRead)),
            Phase::Request { body_due } => body_due.map(|due| (due, Deadline::BodyRead)),
        };
        let due = match phase {
            Some((due, deadline)) if due <= self.retire_by => (due, deadline),
            _ => (self.retire_by, Deadline::MaxAge),
        };
        match self.end_at {
            Some(end) if end < due.0 => (end, Deadline::CertificateExpired),
            _ => due,
        }
    }
}

/// Now, as of the kernel's last tick (Linux; elsewhere `Instant::now`): never later than
/// `Instant::now`, and earlier by at most a tick (1–10 ms), so a deadline counted from it comes
/// that much sooner, never later; and the check of one against it, a tick late at most, is
/// backed by the timer, which fires at the deadline itself. Read at every poll of every
/// connection (for a body sent in small pieces, once a piece): the full clock read was 8 % of the
/// service's CPU under such a body, this one copies a value the kernel keeps.
#[cfg(target_os = "linux")]
fn coarse_now() -> Instant {
    use std::sync::OnceLock;
    // An `Instant` and the monotonic clock's reading just after it: both count from the same
    // origin, so the reading minus this one, added to the `Instant`, is never ahead of it.
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (instant, nanos) = *BASE.get_or_init(|| {
        let instant = Instant::now();
        (instant, idgen::clock::monotonic_ns())
    });
    instant + Duration::from_nanos(idgen::clock::monotonic_coarse_ns().saturating_sub(nanos))
}

#[cfg(not(target_os = "linux"))]
fn coarse_now() -> Instant {
    Instant::now()
}

fn nanos_between(earlier: Instant, later: Instant) -> u64 {
    duration_nanos(later.saturating_duration_since(earlier))
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The connection's socket (plain or TLS), noting when bytes come from the peer.
pub(crate) struct ActivityIo<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I> ActivityIo<I> {
    pub(crate) fn new(inner: I, activity: Arc<Activity>) -> Self {
        ActivityIo { inner, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ActivityIo<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.read_some();
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ActivityIo<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request's body as the service sees it: hyper's, ending the body deadline when it ends (or
/// is dropped unread).
pub(crate) struct RequestBody {
    inner: Incoming,
    /// The connection and the request's number, until the body has ended.
    open: Option<(Arc<Activity>, u64)>,
}

impl RequestBody {
    fn end(&mut self) {
        if let Some((activity, number)) = self.open.take() {
            activity.body_ended(number);
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
            this.end();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.end();
    }
}

/// A connection that ends with [`Deadline`] when the deadline of its phase passes.
pub(crate) struct Guarded<F> {
    connection: Pin<Box<F>>,
    activity: Arc<Activity>,
    timer: Pin<Box<Sleep>>,
    /// When `timer` fires: never later than the deadline in force.
    armed: Instant,
}

impl<F: Future> Guarded<F> {
    pub(crate) fn new(connection: F, activity: Arc<Activity>) -> Self {
        let (armed, _) = activity.deadline();
        Guarded { connection: Box::pin(connection), activity, timer: Box::pin(tokio::time::sleep_until(armed)), armed }
    }
}

impl<F: Future> Future for Guarded<F> {
    type Output = Result<F::Output, Deadline>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.activity.revocable {
            this.activity.wake.register(cx.waker());
        }
        let now = coarse_now();
        // Checked before the connection is polled: a request read from here on never reaches
        // the service.
        if let Some(ended) = this.activity.ended(now) {
            return Poll::Ready(Err(ended));
        }
        this.activity.polling(now);
        if let Poll::Ready(output) = this.connection.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        loop {
            let (due, deadline) = this.activity.deadline();
            // A later deadline leaves the timer where it is (one timer operation less per
            // request); when it fires early, it is set again below.
            if due < this.armed {
                this.timer.as_mut().reset(due);
                this.armed = due;
            }
            match this.timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if due <= Instant::now() => return Poll::Ready(Err(deadline)),
                Poll::Ready(()) => {
                    this.timer.as_mut().reset(due);
                    this.armed = due;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity() -> Arc<Activity> {
        Activity::new(&LimitsSection::default(), None, false)
    }

    #[test]
    fn a_phase_packs_into_one_word_and_back() {
        let opened = Instant::now();
        let at = |nanos| opened + Duration::from_nanos(nanos);
        assert_eq!(Packed::new(IDLE, 5).unpack(opened), Phase::Idle { since: at(5) });
        assert_eq!(Packed::new(HEAD, TIME_MASK).unpack(opened), Phase::Head { since: at(TIME_MASK) });
        assert_eq!(Packed::new(BODY_DUE, u64::MAX).unpack(opened), Phase::Request { body_due: Some(at(TIME_MASK)) });
        assert_eq!(Packed::new(WORKING, 0).unpack(opened), Phase::Request { body_due: None });
    }

    /// The coarse clock is never ahead of `Instant::now`, and behind it by a tick at most (a
    /// kernel's tick is at most 10 ms; 50 allows for a descheduled test thread).
    #[test]
    fn the_coarse_clock_is_never_ahead_and_at_most_a_tick_behind() {
        for _ in 0..10_000 {
            let before = Instant::now();
            let coarse = coarse_now();
            let after = Instant::now();
            assert!(coarse <= after, "the coarse clock ran ahead by {:?}", coarse - after);
            assert!(before.saturating_duration_since(coarse) < Duration::from_millis(50));
        }
    }

    /// Each change of phase takes the time its poll began, and the deadline follows the phase.
    #[test]
    fn the_deadline_follows_the_phase_from_the_time_of_the_poll() {
        let limits = LimitsSection::default();
        let activity = activity();
        let opened = activity.opened;
        assert_eq!(activity.deadline(), (opened + limits.idle_timeout(), Deadline::Idle));
        let poll = opened + Duration::from_millis(700);
        activity.polling(poll);
        activity.read_some();
        assert_eq!(activity.deadline(), (poll + limits.header_read_timeout(), Deadline::HeaderRead));
        activity.polling(poll + Duration::from_millis(1));
        activity.read_some();
        assert_eq!(
            activity.deadline(),
            (poll + limits.header_read_timeout(), Deadline::HeaderRead),
            "a later read leaves the header deadline"
        );
        activity.set(WORKING, 0);
        assert_eq!(activity.deadline(), (activity.retire_by, Deadline::MaxAge), "only the age while the service works");
        let later = poll + Duration::from_secs(2);
        activity.polling(later);
        activity.response_ready();
        assert_eq!(activity.deadline(), (later + limits.idle_timeout(), Deadline::Idle));
    }

    /// A connection never idle when its task yields (pipelined requests, a handler that waits)
    /// is closed past its age and the deadlines of a request under way then, whatever its phase.
    #[test]
    fn a_connection_in_any_phase_is_closed_past_its_age() {
        let limits = LimitsSection { max_connection_age_ms: 1_000, ..LimitsSection::default() };
        let activity = Activity::new(&limits, None, false);
        let grace = limits.header_read_timeout() + limits.body_read_timeout();
        assert!(activity.retire_by >= activity.opened + Duration::from_millis(900) + grace);
        assert!(activity.retire_by <= activity.opened + Duration::from_millis(1_000) + grace);
        assert_eq!(activity.ended(activity.retire_by - Duration::from_nanos(1)), None);
        for phase in [HEAD, WORKING, BODY_DUE] {
            activity.set(phase, duration_nanos(activity.retire_by - activity.opened) + 1);
            assert_eq!(activity.deadline(), (activity.retire_by, Deadline::MaxAge), "phase {phase}");
            assert_eq!(activity.ended(activity.retire_by), Some(Deadline::MaxAge), "phase {phase}");
        }
    }

    /// The body of an earlier request cannot end the body deadline of the one in progress.
    #[test]
    fn only_the_current_requests_body_ends_its_deadline() {
        let activity = activity();
        activity.requests.store(2, Ordering::Relaxed);
        activity.set(BODY_DUE, 9);
        activity.body_ended(1);
        assert_eq!(activity.phase(), Phase::Request { body_due: Some(activity.opened + Duration::from_nanos(9)) });
        activity.body_ended(2);
        assert_eq!(activity.phase(), Phase::Request { body_due: None });
    }
}
