//! Public IDs reveal nothing: over 100,000 consecutive internal IDs, the public IDs' order has
//! no relation to the internal order (Spearman's rank correlation near 0) and no character
//! position is biased (chi-square against uniform), for `opaque` and `encrypted`.

use idgen_public_ids::format::{Format, Keyring, OsRandom, new_opaque};
use idgen_public_ids::store::PublicIdStore;
use zeroize::Zeroizing;

const N: usize = 100_000;

/// Spearman's ρ between the internal order (0..n) and the order of the public IDs.
fn rank_correlation(public_ids: &[String]) -> f64 {
    let mut order: Vec<usize> = (0..public_ids.len()).collect();
    order.sort_by(|&a, &b| public_ids[a].cmp(&public_ids[b]));
    let mut rank = vec![0f64; public_ids.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r as f64;
    }
    let n = public_ids.len() as f64;
    let d2: f64 = rank.iter().enumerate().map(|(i, r)| (i as f64 - r).powi(2)).sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

/// For every position: (position, distinct symbols, chi-square against uniform over them).
/// Positions with one symbol carry no data (padding or the key-version byte) and are skipped.
fn chi_square_by_position(public_ids: &[String]) -> Vec<(usize, usize, f64)> {
    let len = public_ids[0].len();
    let mut out = Vec::new();
    for position in 0..len {
        let mut counts = std::collections::HashMap::<u8, usize>::new();
        for id in public_ids {
            *counts.entry(id.as_bytes()[position]).or_default() += 1;
        }
        if counts.len() < 2 {
            continue;
        }
        let expected = public_ids.len() as f64 / counts.len() as f64;
        let chi: f64 = counts.values().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
        out.push((position, counts.len(), chi));
    }
    out
}

fn check(name: &str, public_ids: &[String]) {
    let rho = rank_correlation(public_ids);
    // Under independence ρ is about N(0, 1/√n) ≈ N(0, 0.0032): 0.02 is over six deviations.
    assert!(rho.abs() < 0.02, "{name}: rank correlation {rho}");
    let positions = chi_square_by_position(public_ids);
    for (position, symbols, chi) in &positions {
        let df = (*symbols - 1) as f64;
        // Six standard deviations above the mean of χ²(df): no position is biased.
        let limit = df + 6.0 * (2.0 * df).sqrt();
        assert!(*chi < limit, "{name}: position {position} ({symbols} symbols) χ² = {chi:.1} ≥ {limit:.1}");
    }
    let worst = positions.iter().map(|p| p.2 / (p.1 - 1) as f64).fold(0.0, f64::max);
    println!(
        "{name}: {} IDs, rank correlation {rho:+.5}, {} positions tested, worst χ²/df {worst:.2}",
        public_ids.len(),
        positions.len()
    );
}

#[tokio::test]
async fn opaque_ids_reveal_nothing() {
    // Mapped through the store, as the service does: consecutive internal IDs, batches of 1,000.
    let dir = tempfile::tempdir().unwrap();
    let store = PublicIdStore::connect(&format!("sqlite://{}", dir.path().join("p.db").display())).await.unwrap();
    let base = 97_301_141_913_751_557u64;
    let opaque = || new_opaque(&OsRandom);
    let mut ids = Vec::with_capacity(N);
    for chunk in (0..N as u64).collect::<Vec<_>>().chunks(1000) {
        let internal: Vec<u64> = chunk.iter().map(|i| base + i).collect();
        let mappings = store.create_batch(&internal, Format::Opaque, None, &opaque, 0).await.unwrap();
        // In internal-ID order.
        ids.extend(mappings.into_iter().map(|m| m.public_id));
    }
    check("opaque", &ids);
}

#[test]
fn encrypted_ids_reveal_nothing() {
    let keyring = Keyring::new(vec![(1, Zeroizing::new((0..32).collect()))]).unwrap();
    let base = 97_301_141_913_751_557u64;
    let ids: Vec<String> = (0..N as u64).map(|i| keyring.encrypt(base + i).unwrap()).collect();
    check("encrypted", &ids);
    // The first two characters carry only the key version: skipped above, constant here.
    assert!(ids.iter().all(|id| id[..2] == ids[0][..2]));
}

#[test]
fn the_checks_can_fail() {
    // Consecutive internal IDs as their own "public IDs": perfectly correlated and biased.
    let ids: Vec<String> = (0..10_000u64).map(|i| format!("{:026}", 97_301_141_913_751_557u64 + i)).collect();
    assert!(rank_correlation(&ids) > 0.99);
    assert!(std::panic::catch_unwind(|| check("transparent", &ids)).is_err());
}
