/* Generated from belugactl/dataplane/rpc/protocol.py by rpc/wire_header.py: do not edit.
 * Regenerate: python -m belugactl.dataplane.rpc.wire_header > belugactl/dataplane/_native_wire.h */
#ifndef BELUGA_NATIVE_WIRE_H
#define BELUGA_NATIVE_WIRE_H

#define RPC_MAGIC 0x554C4542u
#define HDR 32
#define ST_FREE 0
#define ST_REQ 1
#define ST_RESP 2
#define WIRE_MAX_KEY 255
#define LEASE_OWNER_BITS 20
#define FAST_REPLY_MAX 4096

#define HDR_OFF_STATUS 0
#define HDR_OFF_SEQ 8
#define HDR_OFF_MAGIC 16
#define HDR_OFF_EPOCH 20
#define HDR_OFF_OP 24
#define HDR_OFF_CODE 26
#define HDR_OFF_LENGTH 28

#define OP_HELLO 1
#define OP_OPEN_NS 2
#define OP_LOOKUP_PREFIX 3
#define OP_GET 4
#define OP_RESERVE 5
#define OP_COMMIT 6
#define OP_ABORT 7
#define OP_RELEASE 8
#define OP_DELETE 9
#define OP_CLEAR_NS 10
#define OP_STATS 11
#define OP_PING 12
#define OP_GET_MANY 13
#define OP_RESERVE_MANY 14
#define OP_COMMIT_MANY 15
#define OP_REMOVALS 16

#define CODE_OK 0
#define CODE_NOT_FOUND 1
#define CODE_POOL_FULL 2
#define CODE_STALE_EPOCH 3
#define CODE_BAD_MAGIC 4
#define CODE_BAD_OP 5
#define CODE_BAD_LENGTH 6
#define CODE_BAD_ARGS 7
#define CODE_NO_RESERVATION 8
#define CODE_EXISTS 9
#define CODE_NOT_READY 10
#define CODE_TOO_BIG 11
#define CODE_BAD_SEQ 12
#define CODE_INTERNAL 13
#define CODE_UNKNOWN_NS 14
#define CODE_NOT_OWNER 15
#define CODE_NS_LIMIT 16
#define CODE_NO_CHECKSUM 17
#define CODE_QUOTA 18

#endif
