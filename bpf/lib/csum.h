/* Internet checksums (RFC 1071) written by the programs themselves, once:
 * the fold, the incremental updates of RFC 1624, and the checksummed
 * headers of an ICMP error, which the router's time-exceeded (icmp_error.h)
 * and LISP's fragmentation-needed (lisp.h) both build in place. Where the
 * kernel can patch a checksum for us (bpf_l3/l4_csum_replace: vnat.h,
 * portspace, the TTL of a broadcast) its helper is used instead.
 *
 * Only types and inline functions here, no maps: every object may include
 * it without growing. */
#ifndef ONEHOP_CSUM_H
#define ONEHOP_CSUM_H

#include "common.h"

/* Folds a one's-complement sum to the 16-bit Internet checksum (RFC 1071
 * §4.1). Three folds: after two, a carry of the second can be left. */
static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The checksum after one 16-bit word it covers changed from m to m2
 * (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')). All three in network order:
 * a one's-complement sum does not care which (RFC 1071 §2(B)), so no byte
 * swaps. */
static __always_inline __sum16 csum_replace16(__sum16 check, __be16 m, __be16 m2)
{
	return csum_fold((__u32)(__u16)~check + (__u16)~m + (__u16)m2);
}

/* The checksum after a word it covers went down by d (network order),
 * with no borrow out of the word: it goes up by d, its carry wrapped round
 * (RFC 1624 eqn. 3 for a known difference; the kernel's ip_decrease_ttl).
 * Cheaper than csum_replace16 where the difference is a constant: a TTL
 * decremented, an echo request turned into a reply. */
static __always_inline void csum_word_decreased(__sum16 *check, __be16 d)
{
	__u32 c = *check;
	c += d;
	*check = (__u16)(c + (c >= 0xFFFF));
}

/* The header checksum of a 20-byte IPv4 header whose check field is 0.
 * Summed word by word, unrolled, rather than by bpf_csum_diff: no helper
 * call, and the header may be on the stack or in the packet. */
static __always_inline __u16 csum_ipv4(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	return csum_fold(sum);
}

#define ICMP_ERR_ROOM 28 /* an ICMP error's new IPv4 header (20) + ICMP header (8) */

/* The headers of an ICMP error (RFC 792) built in place in front of its
 * quote: a 20-byte IPv4 header from saddr to daddr, with its checksum, and
 * an ICMP header of type, code and rest (its second word), checksum 0 until
 * icmp_error_csum. icmp_len: ICMP header and quote. TOS 0xc0: precedence
 * internetwork control, as Linux marks the ICMP errors it sends. */
static __always_inline void icmp_error_headers(struct iphdr *ip, __be32 saddr, __be32 daddr, __u32 icmp_len,
					       __u8 type, __u8 code, __be32 rest)
{
	__u8 *icmp = (void *)(ip + 1);

	__builtin_memset(ip, 0, sizeof(*ip));
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0xc0;
	ip->tot_len = bpf_htons(sizeof(*ip) + icmp_len);
	ip->ttl = 64;
	ip->protocol = 1; /* ICMP */
	ip->saddr = saddr;
	ip->daddr = daddr;
	ip->check = csum_ipv4(ip);

	icmp[0] = type;
	icmp[1] = code;
	*(__u16 *)(icmp + 2) = 0;
	*(__be32 *)(icmp + 4) = rest;
}

/* Writes the ICMP checksum over the header and the quote after it: every
 * byte up to end, at most max_len (a constant), a multiple of 4 as a quote
 * of a whole IPv4 header and 8 bytes is. Summed in 4-byte steps, each read
 * checked against end, so the verifier sees it inside the packet. */
static __always_inline void icmp_error_csum(__u8 *icmp, void *end, const int max_len)
{
	__u32 acc = 0;

	for (int i = 0; i < max_len / 4; i++) {
		__u32 *w = (__u32 *)(icmp + i * 4);

		if ((void *)(w + 1) > end)
			break;
		__u32 v = *w;
		acc += (v & 0xffff) + (v >> 16);
	}
	*(__u16 *)(icmp + 2) = csum_fold(acc);
}

#endif
