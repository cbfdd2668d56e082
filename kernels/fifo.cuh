// The connector (FIFO) protocol of the step interpreter, run by thread 0 of
// a block for its channel: wait for room or data, check metadata, publish
// and release slots, record errors.
//
// Connector protocol (NCCL's Simple protocol with `slots` slots):
//  * sender: wait until step - head < slots; write the piece into slot
//    step % slots of the receiver's FIFO; fence; write meta[slot] =
//    seq << 32 | bytes; fence; tail = step + 1.
//  * receiver: wait until tail > step; check meta[slot]; read the slot;
//    write the sender's head = step + 1.
// Thread 0 of the block waits and publishes; all threads move data.
#pragma once
#include "gpucoll.cuh"
#include "primitives.cuh"

struct Ctx {
  const GcArgs* a;
  GcSendConn* sc;  // this channel's send connectors, by peer
  GcRecvConn* rc;  // this channel's receive connectors, by peer
  uint64_t status; // GcChanStatus* of this channel
  uint64_t progress;
};

// The abort word is 64 bits: the low half is raised by the host (1 + the
// local rank that failed), the high half by a kernel that hit an error.
__device__ __forceinline__ bool aborted(const GcArgs& a) { return ld_vol64(a.abort_word) != 0; }

__device__ void record_error(const Ctx& c, uint32_t code, uint32_t peer, uint64_t got, uint64_t want) {
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(c.status);
  if (ld_vol32((uint64_t)&st->code) == GC_ERR_NONE) {
    st_vol32((uint64_t)&st->peer, peer);
    st_vol64((uint64_t)&st->got, got);
    st_vol64((uint64_t)&st->want, want);
    __threadfence_system();
    st_vol32((uint64_t)&st->code, code);
  }
  if (code != GC_ERR_ABORTED) {
    // Make every other block of this launch leave too.
    st_vol32(c.a->abort_word + 4, code);
  }
  __threadfence_system();
}

// Whether the receive connector from `peer` holds its next piece (no wait).
__device__ __forceinline__ bool recv_ready(const Ctx& c, uint32_t peer) {
  const GcRecvConn* r = &c.rc[peer];
  return ld_vol64(r->tail) > r->step;
}
__device__ __forceinline__ bool send_ready(const Ctx& c, uint32_t peer) {
  const GcSendConn* s = &c.sc[peer];
  return ld_vol64(s->head) + c.a->slots > s->step;
}

// Spin until `ready` or abort; false on abort (error recorded).
template <typename F>
__device__ bool spin_until(const Ctx& c, uint32_t peer, F ready) {
  uint32_t spins = 0;
  while (!ready()) {
    if (++spins == GC_ABORT_SPINS) {
      spins = 0;
      if (aborted(*c.a)) {
        record_error(c, GC_ERR_ABORTED, peer, 0, 0);
        return false;
      }
    }
  }
  return true;
}

__device__ __forceinline__ uint64_t make_meta(uint32_t seq, uint64_t bytes) {
  return ((uint64_t)seq << 32) | (uint64_t)(uint32_t)bytes;
}

// Receive side: check the metadata of the next piece and return its slot.
__device__ const char* recv_slot(const Ctx& c, uint32_t peer, uint64_t bytes, bool& ok) {
  const GcArgs& a = *c.a;
  GcRecvConn* r = &c.rc[peer];
  uint64_t tail = ld_vol64(r->tail);
  if (tail - r->step > a.slots) {
    record_error(c, GC_ERR_COUNTERS, peer, tail, r->step);
    ok = false;
    return nullptr;
  }
  // No acquire fence (it would also wait for this thread's remote head and
  // tail stores, a full NVLink round trip per piece): the sender fenced its
  // data before the tail, and every later read of the slot is a volatile
  // load issued after this one (bar.sync orders the other threads'), as in
  // NCCL's Simple protocol.
  uint64_t slot = r->step % a.slots;
  uint64_t got = ld_vol64(r->meta + slot * 8);
  uint64_t want = make_meta(a.seq, bytes);
  if (got != want) {
    record_error(c, GC_ERR_META, peer, got, want);
    ok = false;
    return nullptr;
  }
  ok = true;
  return reinterpret_cast<const char*>(r->data + slot * a.slot_bytes);
}

__device__ __forceinline__ char* send_slot_ptr(const Ctx& c, uint32_t peer) {
  const GcSendConn* s = &c.sc[peer];
  return reinterpret_cast<char*>(s->data + (s->step % c.a->slots) * c.a->slot_bytes);
}

// Thread 0 writes the slot's meta when it takes the slot, before the data:
// the per-thread fence after the data then covers it, and publishing the
// tail needs no fence of its own.
__device__ __forceinline__ void send_meta(const Ctx& c, uint32_t peer, uint64_t bytes) {
  const GcSendConn* s = &c.sc[peer];
  uint64_t slot = s->step % c.a->slots;
  st_vol64(s->meta + slot * 8, make_meta(c.a->seq, bytes));
}

// Called after every thread fenced its slot writes (and the meta) and a
// __syncthreads.
__device__ void send_publish(const Ctx& c, uint32_t peer) {
  GcSendConn* s = &c.sc[peer];
  s->step += 1;
  st_vol64(s->tail, s->step);
}

__device__ void recv_release(const Ctx& c, uint32_t peer) {
  GcRecvConn* r = &c.rc[peer];
  r->step += 1;
  st_vol64(r->head, r->step);
}

__device__ void bump_progress(Ctx& c) {
  c.progress += 1;
  GcChanStatus* st = reinterpret_cast<GcChanStatus*>(c.status);
  st_vol64((uint64_t)&st->progress, c.progress);
}
