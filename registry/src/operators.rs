//! Operators' bearer tokens. The registry's configuration keeps only each token's SHA-256
//! (`sha256:` and 64 hex digits), never the token: `idgen registry token` makes a new one, prints
//! it once for its operator, and prints the line for the configuration. A request's token is
//! hashed and compared with every configured hash.
//!
//! A plain SHA-256 is enough here, where a password would need a slow hash: a token is 32 bytes
//! from the operating system's random source, so there is nothing to guess from a leaked hash,
//! and a check costs one hash per write.
//!
//! Two operators with one token would be one operator in the audit, so a configuration that
//! gives two names the same hash is refused at load.

use std::collections::BTreeSet;
use std::fmt;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use ring::rand::SecureRandom;

/// What every token `idgen registry token` makes starts with, so a leaked one is recognizable
/// (by secret scanners, and by whoever finds it in a log).
pub const TOKEN_PREFIX: &str = "idgen_op_";

/// The SHA-256 of an operator token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    pub fn of(token: &str) -> TokenHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        TokenHash(digest.as_ref().try_into().expect("SHA-256 is 32 bytes"))
    }

    /// `sha256:<64 hex digits>`, as the configuration holds it (either case).
    pub fn parse(text: &str) -> Option<TokenHash> {
        let hex = text.strip_prefix("sha256:")?;
        if hex.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks(2)) {
            *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(TokenHash(bytes))
    }

    /// Equal in time independent of where the two first differ.
    fn same(&self, other: &TokenHash) -> bool {
        self.0.iter().zip(other.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl fmt::Display for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A new token: [`TOKEN_PREFIX`] and 32 random bytes in hex. Fails, rather than making a
/// guessable token, when the operating system's random source does.
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the operating system's random source failed"))
        .context("making an operator token")?;
    let mut token = String::from(TOKEN_PREFIX);
    bytes.iter().for_each(|byte| token.push_str(&format!("{byte:02x}")));
    Ok(token)
}

/// The operators known by token: each one's name and token hash, no two with the same hash.
/// The set in force is replaced on reload ([`OperatorTokens::replace`]): a token removed from
/// the configuration stops working at the next SIGHUP.
#[derive(Debug, Default)]
pub struct OperatorTokens {
    operators: ArcSwap<Vec<(TokenHash, String)>>,
}

impl OperatorTokens {
    /// From (name, hash) pairs; refuses two names with one hash, naming both.
    pub fn new(operators: impl IntoIterator<Item = (String, TokenHash)>) -> anyhow::Result<OperatorTokens> {
        let mut known: Vec<(TokenHash, String)> = Vec::new();
        for (name, hash) in operators {
            if let Some((_, other)) = known.iter().find(|(known, _)| known.same(&hash)) {
                bail!(
                    "operators {other:?} and {name:?} have the same token: each operator needs a token of their own \
                     (the audit names who made a change by the token's operator); make one with `idgen registry \
                     token --name {name}`"
                );
            }
            known.push((hash, name));
        }
        Ok(OperatorTokens { operators: ArcSwap::from_pointee(known) })
    }

    /// Puts `fresh`'s operators in force in place of these.
    pub fn replace(&self, fresh: OperatorTokens) {
        self.operators.store(fresh.operators.into_inner());
    }

    pub fn len(&self) -> usize {
        self.operators.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.operators.load().is_empty()
    }

    /// The operator a presented token belongs to. Every hash is compared in full, whichever
    /// matches, so the time taken says nothing about which.
    pub fn operator(&self, token: &str) -> Option<String> {
        let presented = TokenHash::of(token);
        let (operators, mut found) = (self.operators.load(), None);
        for (hash, name) in operators.iter() {
            if hash.same(&presented) {
                found = Some(name);
            }
        }
        found.cloned()
    }
}

/// The callers a role is given by client certificate (`certificate_operators`,
/// `lease_table_recorders`), replaced on reload as the tokens are: a name taken off the list
/// loses the role at the next SIGHUP, and the caller returns the names it took off so that their
/// open connections are closed as a revocation's are.
#[derive(Debug, Default)]
pub struct CertifiedNames {
    names: ArcSwap<BTreeSet<String>>,
}

impl CertifiedNames {
    pub fn new(names: BTreeSet<String>) -> CertifiedNames {
        CertifiedNames { names: ArcSwap::from_pointee(names) }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names.load().contains(name)
    }

    pub fn len(&self) -> usize {
        self.names.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.load().is_empty()
    }

    /// Puts `fresh` in force; returns the names it no longer lists.
    pub fn replace(&self, fresh: BTreeSet<String>) -> BTreeSet<String> {
        let fresh = std::sync::Arc::new(fresh);
        let before = self.names.swap(fresh.clone());
        before.difference(&fresh).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_prints_and_parses_back_and_matches_only_its_token() {
        // SHA-256 of "abc" (FIPS 180-2, appendix B.1).
        let abc = TokenHash::of("abc");
        assert_eq!(abc.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(TokenHash::parse(&abc.to_string()), Some(abc));
        assert_eq!(TokenHash::parse(&abc.to_string().to_uppercase().replace("SHA256", "sha256")), Some(abc));
        for bad in ["", "abc", "sha256:", "sha256:ba78", "md5:ba7816bf8f01cfea414140de5dae2223", &format!("{abc}0")] {
            assert_eq!(TokenHash::parse(bad), None, "{bad:?}");
        }
        assert_eq!(TokenHash::parse(&format!("sha256:{}", "zz".repeat(32))), None);

        let token = new_token().unwrap();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 64, "{token}");
        assert_ne!(token, new_token().unwrap());
        let operators = OperatorTokens::new([("alice".into(), TokenHash::of(&token)), ("bob".into(), abc)]).unwrap();
        assert_eq!(operators.operator(&token).as_deref(), Some("alice"));
        assert_eq!(operators.operator("abc").as_deref(), Some("bob"));
        assert_eq!(operators.operator(&abc.to_string()), None, "the hash itself is not a token");
        assert_eq!(operators.operator(&token[..token.len() - 1]), None);

        // A reload takes a removed token's power away.
        operators.replace(OperatorTokens::new([("bob".into(), abc)]).unwrap());
        assert_eq!((operators.operator(&token), operators.len()), (None, 1));
    }

    #[test]
    fn a_reload_of_certified_names_says_which_it_took_off() {
        let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<BTreeSet<_>>();
        let listed = CertifiedNames::new(names(&["ops-alice", "ops-bob"]));
        assert!(listed.contains("ops-bob"));
        assert_eq!(listed.replace(names(&["ops-alice", "ops-carol"])), names(&["ops-bob"]));
        assert!(!listed.contains("ops-bob") && listed.contains("ops-carol"));
        assert_eq!(listed.replace(names(&[])), names(&["ops-alice", "ops-carol"]));
        assert!(listed.is_empty());
    }

    #[test]
    fn two_operators_with_one_token_are_refused() {
        let hash = TokenHash::of("shared");
        let error = OperatorTokens::new([("alice".into(), hash), ("bob".into(), hash)]).unwrap_err().to_string();
        assert!(error.contains("\"alice\" and \"bob\" have the same token"), "{error}");
    }
}
