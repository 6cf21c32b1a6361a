//! Which endpoint requests go to: the local region's fleet while it answers, else the first
//! backup that does, and back to a more preferred one once its health probe answers 200 `"ok"`.
//!
//! Pure state, no I/O: the client reports what happened and acts on the [`Move`] it gets back.

/// A change of the endpoint in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub from: usize,
    pub to: usize,
    pub why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The endpoint in use failed a request and `to` answered it.
    Failover,
    /// `to`, more preferred than the one in use, answered its health probe.
    Recovered,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Failover => "failover",
            Why::Recovered => "recovered",
        }
    }
}

/// Endpoints by preference: 0 is the local region's fleet, then the backups in order.
#[derive(Debug, Clone)]
pub struct Failover {
    count: usize,
    active: usize,
}

impl Failover {
    pub fn new(count: usize) -> Self {
        assert!(count > 0, "at least one endpoint");
        Failover { count, active: 0 }
    }

    /// The endpoint in use.
    pub fn active(&self) -> usize {
        self.active
    }

    /// The order to try endpoints in for one request: the one in use, then every other one by
    /// preference.
    pub fn order(&self) -> Vec<usize> {
        std::iter::once(self.active).chain((0..self.count).filter(|i| *i != self.active)).collect()
    }

    /// `index` answered a request. If it is not the one in use, requests move to it.
    pub fn answered(&mut self, index: usize) -> Option<Move> {
        if index == self.active {
            return None;
        }
        let moved = Move { from: self.active, to: index, why: Why::Failover };
        self.active = index;
        Some(moved)
    }

    /// The endpoints worth probing: those preferred over the one in use, most preferred first.
    pub fn to_probe(&self) -> std::ops::Range<usize> {
        0..self.active
    }

    /// `index` answered its health probe: requests move to it if it is preferred over the one in
    /// use.
    pub fn probe_answered(&mut self, index: usize) -> Option<Move> {
        if index >= self.active {
            return None;
        }
        let moved = Move { from: self.active, to: index, why: Why::Recovered };
        self.active = index;
        Some(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_stay_local_move_to_the_first_backup_that_answers_and_come_back_on_a_probe() {
        let mut route = Failover::new(3);
        assert_eq!(route.order(), vec![0, 1, 2]);
        assert_eq!(route.answered(0), None, "the local fleet answers: nothing moves");
        assert!(route.to_probe().is_empty(), "nothing to probe while local");

        // 0 failed, 1 failed, 2 answered.
        assert_eq!(route.answered(2), Some(Move { from: 0, to: 2, why: Why::Failover }));
        assert_eq!(route.order(), vec![2, 0, 1], "the one in use first, then by preference");
        assert_eq!(route.to_probe(), 0..2);
        // 1 recovers first: a step towards home, and 0 is still probed.
        assert_eq!(route.probe_answered(1), Some(Move { from: 2, to: 1, why: Why::Recovered }));
        assert_eq!(route.to_probe(), 0..1);
        assert_eq!(route.probe_answered(2), None, "never moves away from a preferred endpoint on a probe");
        assert_eq!(route.probe_answered(0), Some(Move { from: 1, to: 0, why: Why::Recovered }));
        assert_eq!(route.order(), vec![0, 1, 2]);
    }

    #[test]
    fn one_endpoint_never_moves() {
        let mut route = Failover::new(1);
        assert_eq!(route.order(), vec![0]);
        assert_eq!(route.answered(0), None);
        assert_eq!(route.probe_answered(0), None);
    }
}
