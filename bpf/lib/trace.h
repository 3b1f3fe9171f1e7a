/* `onehop trace` (docs/troubleshooting.md): the agent loads a second
 * instance of these same programs with trace_mode set, on the host's live
 * maps, and runs it on a crafted frame with BPF_PROG_RUN. Every write a
 * program makes to a shared map (counters, conntrack, shares, the mapping
 * table, ring buffers, fragment records) and every copy it sends is
 * skipped in that instance; what it decided is written to trace_steps
 * instead, which only the trace instance writes.
 *
 * trace_mode is rodata: the verifier knows its value, so the live
 * programs keep none of the trace code and the trace instance none of the
 * writes (dead branches are removed at load). A trace therefore cannot
 * change what it looks at, by construction rather than by care. */
#ifndef ONEHOP_TRACE_H
#define ONEHOP_TRACE_H

#include "common.h"

volatile const __u8 trace_mode = 0;

/* What the visibility lookup matched (rule_allows). */
enum trace_vis {
	TRACE_VIS_NONE = 0, /* not looked up (same subnet), or nothing matched */
	TRACE_VIS_PORT,     /* the key with protocol and destination port */
	TRACE_VIS_PROTO,    /* the key with protocol, any port */
	TRACE_VIS_ANY,      /* the key with any protocol */
};

/* How a firewall decided (firewall_allows). */
enum trace_fw {
	TRACE_FW_NONE = 0, /* not consulted (no firewall on that VM here) */
	TRACE_FW_RULE,     /* a rule matched: index */
	TRACE_FW_DEFAULT,  /* no rule matched: the direction's default */
	TRACE_FW_MISSING,  /* a rule the count promises is missing: refused */
};

/* What conntrack said (admit). */
enum trace_ct {
	TRACE_CT_SKIPPED = 0, /* not consulted: same subnet, no firewall */
	TRACE_CT_NEW,         /* no live entry this packet may use: the rules decide */
	TRACE_CT_ESTABLISHED, /* passes on an entry opened its way */
	TRACE_CT_REPLY,       /* passes on an entry as an answer */
	TRACE_CT_RECHECKED,   /* an entry from older rules, checked again */
};

/* The record of one trace run. */
struct trace_record {
	__u32 runs;    /* set by the caller before the run; anything else means no run */
	__u32 drop;    /* the drop reason a real packet would count; DROP_NONE when none */
	__u32 forward; /* bit per forward_path counter a real packet would bump */
	__u32 to_ifindex;
	__u32 to_kind;     /* enum redirect_kind */
	__u32 slow;        /* 1 + the slowpath_kind when it would go to the agent */
	__u32 fw_index[2]; /* per direction (FW_IN 0, FW_OUT 1) */
	__u8 fw[2];        /* enum trace_fw per direction */
	__u8 fw_allow[2];
	__u8 vis;     /* enum trace_vis */
	__u8 vis_gen; /* the rule generation looked up */
	__u8 ct;      /* enum trace_ct */
	__u8 ask;     /* 1: the destination would be asked for (no mapping entry yet) */
	/* The visibility key looked up (struct vis_key's ids). */
	__u16 src_farm, src_subnet, dst_farm, dst_subnet;
	__u16 vis_port;
	__u8 vis_proto;
	__u8 _pad;
};

/* Not pinned: each trace instance has its own, and the live programs
 * never write it (every writer is behind trace_mode). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct trace_record);
} trace_steps SEC(".maps");

/* These references put the enums in BTF for bpf2go -type. */
const enum trace_vis *_trace_vis_type __attribute__((unused));
const enum trace_fw *_trace_fw_type __attribute__((unused));
const enum trace_ct *_trace_ct_type __attribute__((unused));

/* The record's key lives in .rodata, not on the stack: the router's
 * programs are within bytes of BPF's 512-byte stack, and a slot for it
 * counts in the live programs' frames even where the code is removed. */
volatile const __u32 trace_key = 0;

static __always_inline struct trace_record *trace_rec(void)
{
	return bpf_map_lookup_elem(&trace_steps, (const void *)&trace_key);
}

static __always_inline void trace_drop(__u32 reason)
{
	struct trace_record *t = trace_rec();
	if (t && !t->drop)
		t->drop = reason;
}

static __always_inline void trace_forward(__u32 path)
{
	struct trace_record *t = trace_rec();
	if (t && path < 32)
		t->forward |= 1U << path;
}

static __always_inline void trace_target(__u32 ifindex, __u32 kind)
{
	struct trace_record *t = trace_rec();
	if (t) {
		t->to_ifindex = ifindex;
		t->to_kind = kind;
	}
}

static __always_inline void trace_ct(__u8 state)
{
	struct trace_record *t = trace_rec();
	if (t)
		t->ct = state;
}

#endif
