//! The topology policy's search: which `k` GPUs, out of some candidates, are best connected.
//!
//! # Objective
//! The score of a set is the sum of its pair scores, and a pair scores the sum over the links
//! between the two GPUs: its PCIe level's points plus 100 per NVLink (NVIDIA go-gpuallocator's
//! `calculateGPUSetScore` and `calculateGPUPairScore`, `docs/reference/topology.md` §1).
//! Sets are compared, best first, by
//! 1. **primary**: the score of the set together with the GPUs the owner already holds (`fixed`);
//! 2. **secondary**, the fragmentation measure (when `spread` is set): how well the GPUs left in
//!    `pool` once the set is taken out stay connected, measured as the sum over their pairs of
//!    [`keep_weight`] (the pair score squared). The largest next request takes every GPU left,
//!    so this is how well that request would be served; squaring makes one NVLinked pair kept
//!    whole (a 230-point pair weighs 52 900) outweigh many cross-socket pairs (10 points, 100
//!    each), so sets are taken where they break the fewest strong pairs;
//! 3. the lowest NVML indices (sorted index lists compared lexicographically).
//!
//! With `S ⊆ pool` and `K(X)` the keep-weight sum over the pairs of `X`,
//! `K(pool ∖ S) = K(pool) − Σ_{v∈S} K_pool(v) + K(S)` (`K_pool(v)`: `v`'s keep weights into
//! `pool`), so both keys are a constant plus a sum of per-GPU terms and per-pair terms. We fold
//! them into one integer, `V(S) = SCALE·primary + secondary`, where `SCALE` exceeds any possible
//! secondary difference, so comparing `V` is comparing (primary, secondary) lexicographically;
//! a pair inside `S` is worth `c(a, b) = SCALE·w(a, b) + keep_weight(w(a, b))`.
//!
//! # Exact search (at most [`EXACT_LIMIT`] candidates)
//! Branch and bound. At a node with chosen set `S`, `r` GPUs still to pick and remaining
//! candidates `C`, an upper bound on what `C` can add is the sum of the `r` largest
//! `g(t) = lin(t) + c(t, S) + ½·(the r−1 largest c(t, u), u ∈ C)`: each pair inside the added set
//! is paid half by each end, and no end can be paid more than its `r−1` best pairs. Values are
//! doubled to keep the halves integral. A subtree is cut when its bound is below the incumbent,
//! or equal to it and the incumbent's index list comes before the most preferred answer the
//! subtree can hold; so the result is the unique best set under the full order, equal to brute
//! force (tested against it), whatever order the candidates are branched on. At every node we
//! branch on the candidate with the largest `g(t)`: with it first, then without it. A one-start
//! greedy seeds the incumbent. Pair scores take few distinct values, so each candidate keeps one
//! mask per score level and its `r−1` best pairs among the remaining cost a few `popcount`s.
//!
//! When more than half the candidates are wanted, the search picks the GPUs to leave out
//! instead (see [`Problem`]), so it never picks more than 8 of 16, where the bound is tighter.
//!
//! # Greedy (more candidates)
//! From every candidate, add the candidate with the best gain until `k` are picked, then swap one
//! member for one outsider while that strictly improves `V`; keep the best result. It is **not
//! exact**, only a local optimum, and answers only when more than [`EXACT_LIMIT`] GPUs are
//! candidates.

use super::set::Bits;
use mesos_gpu_node::inventory::Link;

/// Largest number of GPUs an allocator manages (one bit each in a `u64`).
pub(crate) const MAX_GPUS: usize = 64;

/// Largest number of candidates searched exactly; above it the greedy answers.
pub(crate) const EXACT_LIMIT: usize = 16;

/// Largest pair score: 18 NVLinks at 100 each (`Link::MAX_SCORED_NVLINKS`) on one board (60).
pub(crate) const MAX_PAIR_SCORE: u32 = 100 * Link::MAX_SCORED_NVLINKS + 60;

/// How much a pair left free counts in the fragmentation measure: its pair score squared.
pub(crate) fn keep_weight(score: u32) -> i64 {
    let score = i64::from(score);
    score * score
}

/// Weight of the primary key: the secondary key is at most `64·63/2·keep_weight(MAX_PAIR_SCORE)`
/// < 2³³ apart.
const SCALE: i64 = 1 << 33;

/// Pair scores by NVML index, symmetric, zero on the diagonal.
#[derive(Clone)]
pub(crate) struct Weights {
    w: Box<[[u32; MAX_GPUS]; MAX_GPUS]>,
}

impl Weights {
    /// Scores every pair of `members` with `score(a, b)`, taking the weaker direction when the
    /// two disagree and capping at [`MAX_PAIR_SCORE`].
    pub(crate) fn new(members: u64, score: impl Fn(u32, u32) -> u32) -> Weights {
        let mut w = Box::new([[0; MAX_GPUS]; MAX_GPUS]);
        for a in Bits(members) {
            for b in Bits(members & !(1 << a)) {
                w[a as usize][b as usize] = score(a, b).min(score(b, a)).min(MAX_PAIR_SCORE);
            }
        }
        Weights { w }
    }

    /// The score of the pair `a`, `b` (0 for `a == b` and for indices out of range).
    pub(crate) fn pair(&self, a: u32, b: u32) -> u32 {
        self.w
            .get(a as usize)
            .and_then(|row| row.get(b as usize))
            .copied()
            .unwrap_or(0)
    }

    /// The sum of pair scores over all pairs of `set`.
    pub(crate) fn score(&self, set: u64) -> u64 {
        Bits(set)
            .map(|a| self.degree(a, set & ((1 << a) - 1)))
            .sum()
    }

    /// The sum of the pair scores between `v` and the members of `set` other than `v`.
    pub(crate) fn degree(&self, v: u32, set: u64) -> u64 {
        Bits(set).map(|b| u64::from(self.pair(v, b))).sum()
    }
}

/// The size of the largest subset of `candidates` in which every pair scores at least `min_score`.
pub(crate) fn largest_clique(weights: &Weights, candidates: u64, min_score: u32) -> u32 {
    let mut adjacent = [0u64; MAX_GPUS];
    for a in Bits(candidates) {
        for b in Bits(candidates & !(1 << a)) {
            if weights.pair(a, b) >= min_score {
                adjacent[a as usize] |= 1 << b;
            }
        }
    }
    let mut best = 0;
    grow_clique(&adjacent, 0, candidates, &mut best);
    best
}

/// Extends a clique of `size` members with any of `candidates` (all adjacent to every member).
fn grow_clique(adjacent: &[u64; MAX_GPUS], size: u32, candidates: u64, best: &mut u32) {
    if size + candidates.count_ones() <= *best {
        return;
    }
    let Some(v) = Bits(candidates).next() else {
        *best = size;
        return;
    };
    grow_clique(adjacent, size + 1, candidates & adjacent[v as usize], best);
    grow_clique(adjacent, size, candidates & !(1 << v), best);
}

/// What to search for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query {
    /// GPUs the set is taken from.
    pub(crate) candidates: u64,
    /// GPUs the secondary key measures after the set is taken out (contains `candidates`).
    pub(crate) pool: u64,
    /// GPUs the owner keeps anyway (disjoint from `candidates`); they count in the primary key.
    pub(crate) fixed: u64,
    /// How many candidates to choose.
    pub(crate) size: u32,
    /// Whether the secondary key applies.
    pub(crate) spread: bool,
}

/// The chosen set and whether it is proven best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    /// The chosen GPUs (exactly `size` of the candidates).
    pub(crate) set: u64,
    /// True when the exact search produced it, false when the greedy did.
    pub(crate) exact: bool,
}

/// The best `query.size` candidates, or `None` when there are fewer candidates than that.
pub(crate) fn best(weights: &Weights, query: &Query) -> Option<Found> {
    let problem = Problem::new(weights, query)?;
    let (k, m) = (problem.k, problem.m());
    let (picked, exact) = if k == 0 {
        (0, true)
    } else if k == m {
        (problem.candidates, true)
    } else if m <= EXACT_LIMIT {
        (exact(&problem).set, true)
    } else {
        (greedy(&problem, 0..m).set, false)
    };
    Some(Found {
        set: problem.answer(picked),
        exact,
    })
}

/// The search, restated over the candidates renumbered `0..m` in index order.
///
/// When more than half the candidates are wanted, the problem is turned around: pick the
/// `m − k` candidates `T` to leave out. With `S = C ∖ T`,
/// `2V(S) = const + Σ_{t∈T} (−2·lin(t) − 2·c(t, C)) + Σ_{pairs of T} 2·c`, the same form with other
/// per-position terms, so the same search applies with `r ≤ m/2`. Ties are still broken on `S`.
struct Problem {
    /// NVML index bit of each position.
    bits: Vec<u64>,
    /// All candidates' index bits.
    candidates: u64,
    /// How many positions to pick (`m − size` when `complement`).
    k: usize,
    /// Whether the picked positions are the ones left out.
    complement: bool,
    /// `2·c(a, b)` with `c = SCALE·w + spread·keep_weight(w)`, row-major `m × m`.
    w2q: Vec<i64>,
    /// Per-position term `2·lin(t) = 2·(SCALE·w(t, fixed) − spread·K_pool(t))`, or its
    /// complement form above.
    lin2: Vec<i64>,
    /// For each position, its nonzero pair values `c` by falling value, each with the mask of
    /// the positions it pairs with at that value: `levels[level_start[t]..level_start[t + 1]]`.
    levels: Vec<(i64, u64)>,
    level_start: Vec<usize>,
}

impl Problem {
    fn new(weights: &Weights, query: &Query) -> Option<Problem> {
        let members: Vec<u32> = Bits(query.candidates).collect();
        let m = members.len();
        let size = usize::try_from(query.size).ok().filter(|&k| k <= m)?;
        let complement = 2 * size > m;
        let spread = i64::from(query.spread);
        let mut w2q = vec![0; m * m];
        let mut lin2 = Vec::with_capacity(m);
        let mut levels = Vec::with_capacity(m * m);
        let mut level_start = Vec::with_capacity(m + 1);
        for (a, &ia) in members.iter().enumerate() {
            let row = &weights.w[ia as usize];
            let value = |b: u32| {
                let score = row[b as usize];
                SCALE * i64::from(score) + spread * keep_weight(score)
            };
            let sum = |set: u64| to_i64(Bits(set).map(|b| u64::from(row[b as usize])).sum());
            let kept: i64 = Bits(query.pool).map(|b| keep_weight(row[b as usize])).sum();
            let direct = 2 * (SCALE * sum(query.fixed) - spread * kept);
            lin2.push(if complement {
                -direct - 2 * Bits(query.candidates).map(value).sum::<i64>()
            } else {
                direct
            });
            level_start.push(levels.len());
            for (b, &ib) in members.iter().enumerate() {
                let c = value(ib);
                w2q[a * m + b] = 2 * c;
                if c == 0 {
                    continue;
                }
                match levels[level_start[a]..].iter_mut().find(|(s, _)| *s == c) {
                    Some((_, mask)) => *mask |= 1 << b,
                    None => levels.push((c, 1 << b)),
                }
            }
            levels[level_start[a]..].sort_unstable_by_key(|&(score, _)| std::cmp::Reverse(score));
        }
        level_start.push(levels.len());
        let bits = members.iter().map(|&i| 1 << i).collect();
        let k = if complement { m - size } else { size };
        Some(Problem {
            bits,
            candidates: query.candidates,
            k,
            complement,
            w2q,
            lin2,
            levels,
            level_start,
        })
    }

    fn m(&self) -> usize {
        self.bits.len()
    }

    /// The index bits of a set of positions.
    fn index_bits(&self, positions: u64) -> u64 {
        Bits(positions).fold(0, |acc, p| acc | self.bits[p as usize])
    }

    /// The answer (NVML index bits) for picked index bits `picked`.
    fn answer(&self, picked: u64) -> u64 {
        if self.complement {
            self.candidates & !picked
        } else {
            picked
        }
    }

    /// Picked index bits `picked` of doubled value `value` (ties compare the answers).
    fn scored(&self, picked: u64, value: i64) -> Scored {
        Scored {
            set: picked,
            value,
            tie: self.answer(picked),
        }
    }

    /// The sum of the `n` largest pair values `c` between `t` and the positions in `among`.
    fn best_pairs(&self, t: usize, among: u64, mut n: u32) -> i64 {
        let mut sum = 0;
        for &(c, mask) in &self.levels[self.level_start[t]..self.level_start[t + 1]] {
            if n == 0 {
                break;
            }
            let take = (mask & among).count_ones().min(n);
            sum += c * i64::from(take);
            n -= take;
        }
        sum
    }
}

/// Scores and degrees are below 2³², so they fit an `i64`.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The `r` lowest (or highest) bits of `mask`, which has at least `r`.
fn extreme_bits(mask: u64, r: usize, highest: bool) -> u64 {
    let (mut rest, mut out) = (mask, 0);
    for _ in 0..r {
        if rest == 0 {
            break;
        }
        let bit = if highest {
            (1 << 63) >> rest.leading_zeros()
        } else {
            rest & rest.wrapping_neg()
        };
        out |= bit;
        rest &= !bit;
    }
    out
}

/// Whether `a` comes before `b` when both are read as sorted index lists (equal sizes).
fn lex_before(a: u64, b: u64) -> bool {
    let diff = a ^ b;
    diff != 0 && a & diff & diff.wrapping_neg() != 0
}

/// Picked index bits, their doubled value `2·V`, and the answer they stand for (for ties).
#[derive(Debug, Clone, Copy)]
struct Scored {
    set: u64,
    value: i64,
    tie: u64,
}

impl Scored {
    fn beats(self, other: Scored) -> bool {
        self.value > other.value || (self.value == other.value && lex_before(self.tie, other.tie))
    }
}

/// The greedy with swap improvement from each of the `starts` positions; `p.k ≥ 1`.
fn greedy(p: &Problem, starts: std::ops::Range<usize>) -> Scored {
    let m = p.m();
    let mut best: Option<Scored> = None;
    let mut link = vec![0i64; m];
    for start in starts {
        link.iter_mut().for_each(|l| *l = 0);
        let mut set = 0u64;
        let mut value = 0;
        let add = |t: usize, set: &mut u64, value: &mut i64, link: &mut [i64]| {
            *value += p.lin2[t] + link[t];
            *set |= 1 << t;
            for (u, l) in link.iter_mut().enumerate() {
                *l += p.w2q[t * m + u];
            }
        };
        add(start, &mut set, &mut value, &mut link);
        for _ in 1..p.k {
            let mut next: Option<(i64, usize)> = None;
            for t in (0..m).filter(|&t| set & 1 << t == 0) {
                let gain = p.lin2[t] + link[t];
                if next.is_none_or(|(g, _)| gain > g) {
                    next = Some((gain, t));
                }
            }
            let Some((_, t)) = next else { break };
            add(t, &mut set, &mut value, &mut link);
        }
        // Swap one member for one outsider while that strictly improves the value.
        loop {
            let mut step: Option<(i64, usize, usize)> = None;
            for o in Bits(set).map(|o| o as usize) {
                let lose = p.lin2[o] + link[o];
                for n in (0..m).filter(|&n| set & 1 << n == 0) {
                    let delta = p.lin2[n] + link[n] - p.w2q[o * m + n] - lose;
                    if delta > 0 && step.is_none_or(|(d, _, _)| delta > d) {
                        step = Some((delta, o, n));
                    }
                }
            }
            let Some((delta, o, n)) = step else { break };
            value += delta;
            set = set & !(1 << o) | 1 << n;
            for (u, l) in link.iter_mut().enumerate() {
                *l += p.w2q[n * m + u] - p.w2q[o * m + u];
            }
        }
        let found = p.scored(p.index_bits(set), value);
        if best.is_none_or(|b| found.beats(b)) {
            best = Some(found);
        }
    }
    best.unwrap_or_else(|| p.scored(0, i64::MIN))
}

/// The exact branch and bound; `p` has at most [`EXACT_LIMIT`] candidates and `1 ≤ p.k < m`.
fn exact(p: &Problem) -> Scored {
    let m = p.m();
    let mut search = Exact {
        p,
        m,
        link: [0; EXACT_LIMIT],
        best: greedy(p, 0..1),
    };
    search.dfs(0, (1 << m) - 1, p.k, 0);
    search.best
}

struct Exact<'a> {
    p: &'a Problem,
    m: usize,
    /// `2·c(t, S)` for every remaining position `t`.
    link: [i64; EXACT_LIMIT],
    best: Scored,
}

impl Exact<'_> {
    /// Searches below the node that has picked index bits `chosen`, with `r` more to pick from
    /// the positions in `remaining`; `value` is the chosen set's doubled value.
    fn dfs(&mut self, chosen: u64, remaining: u32, r: usize, value: i64) {
        if r == 0 {
            let found = self.p.scored(chosen, value);
            if found.beats(self.best) {
                self.best = found;
            }
            return;
        }
        if (remaining.count_ones() as usize) < r {
            return;
        }
        let (gain_bound, v) = self.bound(remaining, r);
        let bound = value + gain_bound;
        if bound < self.best.value
            || (bound == self.best.value && !self.may_tie_better(chosen, remaining, r))
        {
            return;
        }
        // Branch on the most promising position: with it, then without it.
        let (m, w2q) = (self.m, &self.p.w2q);
        let rest = remaining & !(1 << v);
        let gain = self.p.lin2[v] + self.link[v];
        for t in Bits(u64::from(rest)).map(|t| t as usize) {
            self.link[t] += w2q[v * m + t];
        }
        self.dfs(chosen | self.p.bits[v], rest, r - 1, value + gain);
        for t in Bits(u64::from(rest)).map(|t| t as usize) {
            self.link[t] -= w2q[v * m + t];
        }
        self.dfs(chosen, rest, r, value);
    }

    /// Whether a set below this node could win a tie with the incumbent: whether the most
    /// preferred answer it can hold (lowest indices picked, or highest left out) comes first.
    fn may_tie_better(&self, chosen: u64, remaining: u32, r: usize) -> bool {
        let rest = self.p.index_bits(u64::from(remaining));
        let first = self
            .p
            .answer(chosen | extreme_bits(rest, r, self.p.complement));
        lex_before(first, self.best.tie)
    }

    /// An upper bound on what choosing `r` more of `remaining` can add, and the remaining
    /// position with the largest `g(t)`, to branch on.
    fn bound(&self, remaining: u32, r: usize) -> (i64, usize) {
        let p = self.p;
        let mut gains = [0i64; EXACT_LIMIT];
        let mut count = 0;
        let mut top = (i64::MIN, 0);
        let pairs_each = u32::try_from(r - 1).unwrap_or(u32::MAX);
        for t in Bits(u64::from(remaining)).map(|t| t as usize) {
            let among = u64::from(remaining) & !(1 << t);
            let g = p.lin2[t] + self.link[t] + p.best_pairs(t, among, pairs_each);
            if g > top.0 {
                top = (g, t);
            }
            gains[count] = g;
            count += 1;
        }
        let gains = &mut gains[..count];
        if r < gains.len() {
            gains.select_nth_unstable_by(r - 1, |a, b| b.cmp(a));
        }
        (gains[..r].iter().sum(), top.1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The set `0..k`.
    fn low_bits(k: usize) -> u64 {
        if k >= 64 { u64::MAX } else { (1 << k) - 1 }
    }

    /// The sum of the keep weights over the pairs of `set`.
    fn kept(weights: &Weights, set: u64) -> i64 {
        Bits(set)
            .flat_map(|a| Bits(set & ((1 << a) - 1)).map(move |b| (a, b)))
            .map(|(a, b)| keep_weight(weights.pair(a, b)))
            .sum()
    }

    /// Brute force over every `size`-subset of the candidates, under the module's order.
    fn brute_force(weights: &Weights, q: &Query) -> Option<u64> {
        let members: Vec<u32> = Bits(q.candidates).collect();
        let mut best: Option<((u64, i64), u64)> = None;
        for sub in 0u64..1 << members.len() {
            if sub.count_ones() != q.size {
                continue;
            }
            let set = Bits(sub).fold(0, |acc, pos| acc | 1 << members[pos as usize]);
            let primary = weights.score(set | q.fixed);
            let secondary = if q.spread {
                kept(weights, q.pool & !set)
            } else {
                0
            };
            let key = (primary, secondary);
            // Subsets are visited in increasing mask order, which is not lexicographic order of
            // index lists: compare explicitly.
            if best.is_none_or(|(k, s)| key > k || (key == k && lex_before(set, s))) {
                best = Some((key, set));
            }
        }
        best.map(|(_, set)| set)
    }

    fn weights_from(n: u32, scores: &[u32]) -> Weights {
        Weights::new(low_bits(n as usize), |a, b| {
            scores[(a * n + b) as usize % scores.len()]
        })
    }

    fn query() -> impl Strategy<Value = (u32, Vec<u32>, Query)> {
        (2u32..=12)
            .prop_flat_map(|n| {
                let pair = prop_oneof![
                    Just(0u32),
                    Just(10),
                    Just(20),
                    Just(30),
                    Just(40),
                    Just(50),
                    Just(60),
                    (1u32..=4).prop_map(|l| 100 * l)
                ];
                let all = low_bits(n as usize);
                (
                    Just(n),
                    prop::collection::vec(pair, (n * n) as usize),
                    0..=all,
                    0..=all,
                    0..=all,
                    0..=n,
                    any::<bool>(),
                )
            })
            .prop_map(|(n, scores, pool, cand, fixed, size, spread)| {
                let candidates = cand & pool;
                let q = Query {
                    candidates,
                    pool,
                    fixed: fixed & !candidates,
                    size,
                    spread,
                };
                (n, scores, q)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// (a) The exact search returns the brute-force optimum, tie-breaks included.
        #[test]
        fn exact_equals_brute_force((n, scores, q) in query()) {
            let weights = weights_from(n, &scores);
            let found = best(&weights, &q);
            prop_assert_eq!(found.map(|f| f.set), brute_force(&weights, &q));
            if let Some(found) = found {
                prop_assert!(found.exact);
            }
        }

        /// (c) The greedy, too, returns exactly `size` candidates, never a partial set.
        #[test]
        fn greedy_returns_a_whole_set((n, scores, q) in query()) {
            let weights = weights_from(n, &scores);
            if let Some(problem) = Problem::new(&weights, &q) {
                let picked = if problem.k == 0 { 0 } else { greedy(&problem, 0..problem.m()).set };
                let set = problem.answer(picked);
                prop_assert_eq!(set.count_ones(), q.size);
                prop_assert_eq!(set & !q.candidates, 0);
            } else {
                prop_assert!(q.candidates.count_ones() < q.size);
            }
        }
    }

    #[test]
    fn too_few_candidates_is_none() {
        let weights = weights_from(4, &[10]);
        let q = Query {
            candidates: 0b11,
            pool: 0b11,
            fixed: 0,
            size: 3,
            spread: true,
        };
        assert_eq!(best(&weights, &q), None);
    }

    #[test]
    fn asymmetric_scores_take_the_weaker_direction_and_cap() {
        let weights = Weights::new(0b111, |a, b| match (a, b) {
            (0, 1) => 200,
            (1, 0) => 0,
            (1, 2) | (2, 1) => 50_000,
            _ => 10,
        });
        assert_eq!(weights.pair(0, 1), 0);
        assert_eq!(weights.pair(1, 2), MAX_PAIR_SCORE);
        assert_eq!(weights.pair(0, 0), 0);
        assert_eq!(weights.pair(0, 99), 0);
        assert_eq!(weights.score(0b111), u64::from(MAX_PAIR_SCORE) + 10);
    }

    #[test]
    fn above_the_exact_limit_the_greedy_answers_with_a_whole_set() {
        let n = 40u32;
        let weights = Weights::new(
            low_bits(n as usize),
            |a, b| if a / 4 == b / 4 { 200 } else { 10 },
        );
        for size in [0, 1, 3, 4, 8, 21, 40] {
            let all = low_bits(n as usize);
            let q = Query {
                candidates: all,
                pool: all,
                fixed: 0,
                size,
                spread: size >= 2,
            };
            let found = best(&weights, &q).unwrap();
            assert_eq!(found.set.count_ones(), size);
            assert_eq!(found.exact, size == 0 || size == n);
        }
        // Groups of four are found whole: {0,1,2,3} first by the index tie-break.
        let all = low_bits(n as usize);
        let q = Query {
            candidates: all,
            pool: all,
            fixed: 0,
            size: 4,
            spread: true,
        };
        assert_eq!(best(&weights, &q).unwrap().set, 0b1111);
    }
}
