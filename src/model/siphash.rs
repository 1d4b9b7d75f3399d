//! The SipHash round (Aumasson and Bernstein), shared by the keyed hashes that need
//! it: Maglev's per-server permutations (SipHash-1-3, `crate::sched::mh`) and the SYN
//! proxy's cookies (SipHash-2-4, `crate::forward::synproxy`). Each caller runs its
//! own compression and finalisation rounds around it.

/// One SipRound over the state `v`.
#[inline(always)]
pub fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}
