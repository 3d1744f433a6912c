/*
 * The order saga of Backstop, as a Promela model (docs/REFERENCE.md, Order states and
 * Guarantees). model/README.md says what is modelled, what is abstracted away and how to run it;
 * tests/model/ runs it in CI.
 *
 * One process per actor and order: the customer (checkout, payment start, cancel), the provider
 * (the customer at the hosted page, async settlement, expiry), the webhook endpoint (notices
 * delivered, duplicated, reordered or lost), the order's deadline, the reconciliation sweep, two
 * outbox workers (the compensation and the refund command, delivered at least once), and an
 * operator (a refund of a paid order, with or without restock). Every handler's transaction is
 * one atomic step; a writer that reads, calls the provider and then saves (payment start, the
 * customer's cancel, the compensation) is two steps, and its save is guarded by the version it
 * read (SAVE_GUARD), as store.order_store.save is.
 *
 * The lines marked SEEDED are what tests/model/test_saga_spin.py rewrites to plant one bug each.
 */

#ifndef N
#define N 2            /* orders (one customer each, one unit per order) */
#endif
#ifndef STOCK
#define STOCK 1        /* units on hand at the start */
#endif
#ifndef MAXS
#define MAXS 2
#endif
#ifndef HOLD
#define HOLD 0         /* 1: CAPTURE_MODE=dispatch, a card payment held until the order ships */
#endif

/* Order states (shop.domain.order.OrderStatus); REJECTED: the checkout was refused (out of stock). */
#define NONE 0
#define PENDING 1
#define INITIATED 2
#define PAID 3
#define FAILED 4
#define CANCELLED 5
#define REJECTED 6
#define AUTHORIZED 7   /* the card payment held, captured when an operator ships the order */

/* A Checkout Session at the provider. */
#define S_NONE 0
#define S_OPEN 1
#define S_PAID 2
#define S_PROC 3       /* complete, an asynchronous payment settling */
#define S_AFAIL 4      /* complete, the asynchronous payment failed */
#define S_EXPT 5       /* expired at its expires_at: the order's payment window ran out */
#define S_EXPE 6       /* expired early, by hand at the provider */
#define S_EXPC 7       /* expired by the shop: a cancel retiring it, or a start that lost its race */
#define S_HELD 8       /* complete, the card payment held (requires_capture) */
#define S_CAPT 9       /* the hold captured: the money taken */
#define S_VOID 10      /* the hold ended uncaptured: voided by the shop, or lapsed at its capture_before */

/* Webhook notices waiting per session, one bit per event type; each carries its snapshot. */
#define W_PAID 1       /* checkout.session.completed (paid) or async_payment_succeeded */
#define W_HELD 2       /* checkout.session.completed (unpaid, the payment held) */
#define W_AFAIL 4      /* checkout.session.async_payment_failed */
#define W_EXP 8        /* checkout.session.expired */
#define W_CANCELED 16  /* payment_intent.canceled: the hold voided or lapsed */

/* Compensation delivery (outbox_deliveries of restore_inventory). */
#define D_NONE 0
#define D_PENDING 1
#define D_DONE 2

/* What a replay compares after each step (tests/model/test_model_conformance.py): a STEP line's
   printf also prints `STATE <on hand> <order's state> <marker> <refund rows> <provider refunds>`
   of the order that moved (only it and the shared on hand can change in one step); printing is
   part of the step's own statement, so it adds nothing to the state space. */
#if MAXS > 1
#define ROWS(o) (refund_row[SI(o, 0)] + refund_row[SI(o, 1)])
#define REFUNDS(o) (provider_refunds[SI(o, 0)] + provider_refunds[SI(o, 1)])
#else
#define ROWS(o) refund_row[SI(o, 0)]
#define REFUNDS(o) provider_refunds[SI(o, 0)]
#endif
#define SHOWN(o) onhand, st[o], restored[o], ROWS(o), REFUNDS(o)

#define LIVE(o) (st[o] == PENDING || st[o] == INITIATED || st[o] == FAILED)
#define UNPAID(o) (st[o] == PENDING || st[o] == FAILED)
#define SI(o, k) ((o) * MAXS + (k))
#define CUR(o) SI(o, psess[o] - 1)

/* The order's version, as what it means to a writer that read it: every write of the order
   makes the reads held by other writers stale (R_* below name the readers). */
#define R_CUSTOMER 1
#define R_WORKER 2
#define R_TWIN 4
#define BUMP(o) stale[o] = reading[o]
#define READ(o, r) reading[o] = reading[o] | r; stale[o] = stale[o] & ~r
#define DONE_READING(o, r) reading[o] = reading[o] & ~r; stale[o] = stale[o] & ~r
/* SEEDED (d): the store's save is UPDATE ... WHERE version = <read> (store.order_store.save). */
#define SAVE_GUARD(o, r) ((stale[o] & r) == 0)
/* SEEDED (a): the compensation's once-only marker, read and written (orders.inventory_restored). */
#define MARKER_SET(o) restored[o]
#define MARK_RESTORED(o) restored[o] = 1; BUMP(o)
/* SEEDED (c): money for an order that can no longer take it (payments.apply._apply_paid). */
#define LATE_MONEY(o, k) (st[o] == CANCELLED || (st[o] == PAID && psess[o] != k + 1))
/* SEEDED (f): a ship's note of the capture (order_store.note_capture) moves the order's version,
   so a cancel that read the order before it loses its race. */
#define NOTE_CAPTURE(o) capreq[o] = 1; BUMP(o)

short onhand = STOCK;
byte st[N], psess[N], nsess[N], restore[N], reading[N], stale[N];
bit placed[N], restored[N], watch[N], deadline[N], op_refunded[N];
byte sess[N * MAXS], notes[N * MAXS];
bit shown[N * MAXS], refund_row[N * MAXS], refund_cmd[N * MAXS];
/* Ghosts: what happened, for the properties only. */
byte gave[N];                   /* times the order's stock was given back */
byte provider_refunds[N * MAXS]; /* late-money refunds the provider made of each session */
bit was_paid[N], was_cancelled[N];
/* Capture at dispatch: the ship's note (capture_requested_at), shipped, the hold's deadline
   (END_HOLD), the capture command (C_*), a void command per session and whether one was asked. */
#define C_NONE 0
#define C_PENDING 1
#define C_DONE 2
#define C_DEAD 3       /* the provider refused: a dead letter for an operator */
bit capreq[N], shipped[N], hold_dl[N], voidcmd[N * MAXS], voidasked[N * MAXS];
byte capcmd[N];
/* Ghosts: holds taken at the provider, holds the shop voided, sessions that were ever held. */
byte captures[N * MAXS];
bit voided[N * MAXS], was_held[N * MAXS];

/* --- the guarded transitions' effects (shop.domain.order), each inside its writer's atomic step --- */

/* cancel: OrderCancelled to the outbox (the compensation's delivery), the deadline obsolete. */
inline t_cancel(o) {
  st[o] = CANCELLED; BUMP(o); was_cancelled[o] = 1; deadline[o] = 0; hold_dl[o] = 0; restore[o] = D_PENDING
}
/* mark_authorized: held through session k; the hold's own deadline armed in the same commit. */
inline t_authorized(o, k) {
  st[o] = AUTHORIZED; psess[o] = k + 1; BUMP(o); deadline[o] = 0; hold_dl[o] = 1
}
/* payments.holds.schedule_void: once per session. */
inline schedule_void(o, k) {
  if
  :: !voidasked[SI(o, k)] -> voidasked[SI(o, k)] = 1; voidcmd[SI(o, k)] = 1
  :: else -> skip
  fi
}
/* SEEDED (e): a held order's cancel voids its hold, never refunds it. */
#define HELD_CANCEL(o) schedule_void(o, psess[o] - 1)
/* payments.holds.cancel_held, its save: the cancel, and the void of the order's own hold. */
inline t_cancel_held(o) {
  t_cancel(o); HELD_CANCEL(o)
}
/* payments.holds.apply_held for session k's hold. */
inline apply_held(o, k) {
  if
  :: st[o] == INITIATED && psess[o] == k + 1 -> t_authorized(o, k)
  :: st[o] == AUTHORIZED && psess[o] == k + 1 -> skip              /* already authorized */
  :: st[o] == CANCELLED || st[o] == PAID || (st[o] == AUTHORIZED && psess[o] != k + 1) -> schedule_void(o, k)
  :: else -> skip                                                  /* an order not waiting: noop */
  fi
}
/* mark_paid / adopt_and_pay: paid through session k. */
inline t_paid(o, k) {
  st[o] = PAID; psess[o] = k + 1; BUMP(o); was_paid[o] = 1; deadline[o] = 0
}
/* mark_payment_failed: a fresh window, its deadline armed. */
inline t_failed(o) {
  st[o] = FAILED; BUMP(o); deadline[o] = 1
}
/* payments.refunds.record_late_payment: a refunds row unique per (order, session) and its
   refund_payment command; a cancelled order's own session is watched by the sweep. */
inline late_money(o, k) {
  if
  :: !refund_row[SI(o, k)] -> refund_row[SI(o, k)] = 1; refund_cmd[SI(o, k)] = 1;
       if
       :: st[o] == CANCELLED && psess[o] == k + 1 -> watch[o] = 1
       :: else -> skip
       fi
  :: else -> skip    /* already refunded: the unique row */
  fi
}

/* payments.apply._apply_once for session k of order o, the provider's view being `view` (a
   session state); `hook`: it came by webhook (only the webhook knows an expiry was a cancel's). */
inline apply(o, k, view, hook) {
  if
  :: view == S_HELD -> apply_held(o, k)
  :: view == S_PAID ->
       if
       :: st[o] == PAID && psess[o] == k + 1 -> skip          /* already paid: a duplicate */
       :: LATE_MONEY(o, k) -> late_money(o, k)
       :: st[o] == INITIATED || UNPAID(o) -> t_paid(o, k)      /* adopt_and_pay from an unpaid state */
       fi
  :: else ->
       if
       :: st[o] == CANCELLED && psess[o] == k + 1 && (view == S_PROC || view == S_AFAIL) -> watch[o] = 1
       :: else -> skip
       fi;
       if
       :: st[o] != INITIATED || psess[o] != k + 1 -> skip      /* not the order's open attempt: no-op */
       :: else ->
            if
            :: view == S_EXPT || (view == S_EXPC && hook) -> t_cancel(o)
            :: view == S_EXPE || (view == S_EXPC && !hook) || view == S_AFAIL -> t_failed(o)
            :: view == S_PROC || view == S_OPEN -> skip        /* awaiting the async payment */
            fi
       fi
  fi
}

/* --- the customer: checkout, payment start ("Pay now"), cancel (orders.checkout, payments.start,
   orders.cancel) --- */
proctype customer(byte o) {
  byte k, was;
  bit money, asked;
  /* Checkout: one transaction, the conditional decrement (on_hand >= n) last; a shortfall rolls
     the whole order back. The deadline is armed in the same commit. */
  atomic {
    if
    :: onhand >= 1 -> onhand--; placed[o] = 1; st[o] = PENDING; deadline[o] = 1;
         printf("STEP %d checkout\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
    :: else -> st[o] = REJECTED; printf("STEP %d checkout_refused\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
    fi
  }
end:
  do
  :: atomic { UNPAID(o) && nsess[o] < MAXS ->
       /* start_payment: read, then the provider creates a session outside any transaction */
       READ(o, R_CUSTOMER); k = nsess[o]; nsess[o]++; sess[SI(o, k)] = S_OPEN; printf("STEP %d start %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o)) }
     atomic {
       if
       :: SAVE_GUARD(o, R_CUSTOMER) -> st[o] = INITIATED; psess[o] = k + 1; BUMP(o); shown[SI(o, k)] = 1;
            printf("STEP %d started %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
       :: else -> /* LostRace: the session it just made is expired, never shown to the customer */
            if
            :: sess[SI(o, k)] == S_OPEN -> sess[SI(o, k)] = S_EXPC; notes[SI(o, k)] = notes[SI(o, k)] | W_EXP
            :: else -> skip
            fi;
            printf("STEP %d start_lost %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
       fi;
       DONE_READING(o, R_CUSTOMER); k = 0
     }
  :: atomic { (LIVE(o) || st[o] == AUTHORIZED) -> READ(o, R_CUSTOMER); was = st[o]; k = psess[o]; money = 0; asked = capreq[o];
       printf("STEP %d cancel\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
     /* An order at the hosted page: its session is retired first, no transaction open. */
     if
     :: was == INITIATED ->
          atomic {
            if
            :: sess[SI(o, k - 1)] == S_PAID -> was = PAID      /* paid: the payment stands, cancel refused */
            :: sess[SI(o, k - 1)] == S_OPEN ->                  /* SEEDED (b): the retire */
                 sess[SI(o, k - 1)] = S_EXPC; notes[SI(o, k - 1)] = notes[SI(o, k - 1)] | W_EXP
            :: sess[SI(o, k - 1)] == S_OPEN -> money = 1        /* provider unreachable: cancel, watched */
            :: sess[SI(o, k - 1)] == S_PROC -> money = 1        /* an async payment settling: watched */
            :: else -> skip                                     /* already expired or failed */
            fi;
            printf("STEP %d cancel_retire %d %d %d %d\nSTATE %d %d %d %d %d\n", o, k - 1, was == PAID, money, sess[SI(o, k - 1)], SHOWN(o))
          }
     :: else -> skip
     fi;
     atomic {
       if
       :: was == PAID || (was == AUTHORIZED && asked) ->    /* paid, or a ship is capturing the hold */
            printf("STEP %d cancel_refused\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
       :: was == AUTHORIZED && !asked && SAVE_GUARD(o, R_CUSTOMER) ->
            /* orders.cancel.cancel_authorized: cancel_held with the order it read, its save guarded */
            t_cancel_held(o); printf("STEP %d cancelled\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
       :: was == AUTHORIZED && !asked && !SAVE_GUARD(o, R_CUSTOMER) ->
            /* LostRace: once more with the order read afresh */
            if
            :: st[o] == AUTHORIZED && !capreq[o] -> t_cancel_held(o)
            :: else -> skip
            fi;
            printf("STEP %d cancel_moved\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
       :: was != PAID && was != AUTHORIZED && SAVE_GUARD(o, R_CUSTOMER) -> t_cancel(o); watch[o] = money; printf("STEP %d cancelled\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
       :: was != PAID && was != AUTHORIZED && !SAVE_GUARD(o, R_CUSTOMER) ->
            /* _moved_by_this_cancel: a PaymentFailed on the very session it retired is cancelled again */
            if
            :: was == INITIATED && st[o] == FAILED && psess[o] == k -> t_cancel(o); watch[o] = money
            :: else -> skip
            fi;
            printf("STEP %d cancel_moved\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
       fi;
       DONE_READING(o, R_CUSTOMER); k = 0; was = 0; money = 0; asked = 0
     }
  od
}

/* --- the provider: the customer at the hosted page, async settlement, expiry --- */
/* A hold lasts days (authorization_validity_seconds); the sweep asks about an order waiting at its
   page within minutes: a hold lapses only once its order no longer waits for it. */
#define LAPSES(o, k) (sess[SI(o, k)] == S_HELD && !(st[o] == INITIATED && psess[o] == k + 1))
inline hosted(o, k) {
  if
  :: sess[SI(o, k)] == S_OPEN && shown[SI(o, k)] ->
       if
#if HOLD
       /* a card payment held (asynchronous methods capture at once: the checkout mode's journey) */
       :: sess[SI(o, k)] = S_HELD; was_held[SI(o, k)] = 1; notes[SI(o, k)] = notes[SI(o, k)] | W_HELD;
          printf("STEP %d held %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
#else
       :: sess[SI(o, k)] = S_PAID; notes[SI(o, k)] = notes[SI(o, k)] | W_PAID; printf("STEP %d pay %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
       :: sess[SI(o, k)] = S_PROC; printf("STEP %d async %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
#endif
       :: sess[SI(o, k)] = S_EXPT; notes[SI(o, k)] = notes[SI(o, k)] | W_EXP; printf("STEP %d expire %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
#if !HOLD
       :: sess[SI(o, k)] = S_EXPE; notes[SI(o, k)] = notes[SI(o, k)] | W_EXP; printf("STEP %d expire_early %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
#endif
       fi
  :: sess[SI(o, k)] == S_OPEN && !shown[SI(o, k)] ->   /* a session nobody was sent to runs out */
       sess[SI(o, k)] = S_EXPT; notes[SI(o, k)] = notes[SI(o, k)] | W_EXP; printf("STEP %d expire %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
  :: LAPSES(o, k) ->    /* the hold's capture_before passed: the provider ends it */
       sess[SI(o, k)] = S_VOID; notes[SI(o, k)] = notes[SI(o, k)] | W_CANCELED; printf("STEP %d lapse %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
  :: sess[SI(o, k)] == S_PROC ->
       if
       :: sess[SI(o, k)] = S_PAID; notes[SI(o, k)] = notes[SI(o, k)] | W_PAID; printf("STEP %d async_ok %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
       :: sess[SI(o, k)] = S_AFAIL; notes[SI(o, k)] = notes[SI(o, k)] | W_AFAIL; printf("STEP %d async_fail %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
       fi
  fi
}
#define PROVIDER_MAY(o, k) (sess[SI(o, k)] == S_OPEN || sess[SI(o, k)] == S_PROC || LAPSES(o, k))

proctype provider(byte o) {
end:
  do
  :: atomic { PROVIDER_MAY(o, 0) -> hosted(o, 0) }
#if MAXS > 1
  :: atomic { PROVIDER_MAY(o, 1) -> hosted(o, 1) }
#endif
  od
}

/* payments.holds.hold_ended (payment_intent.canceled): an Authorized order ends as at its hold's
   deadline, even one being captured: that capture cannot succeed now. */
inline hold_ended(o, k) {
  if
  :: st[o] == AUTHORIZED && psess[o] == k + 1 -> t_cancel_held(o)
  :: else -> skip
  fi
}
inline deliver(o, k, w, view) {
  if
  :: w == W_CANCELED -> hold_ended(o, k)
  :: else -> apply(o, k, view, 1)
  fi
}

/* --- the webhook endpoint: any waiting notice (so reordered), applied and dropped, applied and
   kept for another delivery (duplicated), or lost --- */
inline notice(o, k) {
  if
  :: notes[SI(o, k)] & W_PAID -> w = W_PAID; view = S_PAID
  :: notes[SI(o, k)] & W_AFAIL -> w = W_AFAIL; view = S_AFAIL
  :: notes[SI(o, k)] & W_EXP -> w = W_EXP; view = sess[SI(o, k)]   /* the expired snapshot */
#if HOLD
  :: notes[SI(o, k)] & W_HELD -> w = W_HELD; view = S_HELD
  :: notes[SI(o, k)] & W_CANCELED -> w = W_CANCELED; view = S_VOID
#endif
  fi;
  if
  :: true -> deliver(o, k, w, view); notes[SI(o, k)] = notes[SI(o, k)] & ~w; printf("STEP %d webhook %d %d\nSTATE %d %d %d %d %d\n", o, k, w, SHOWN(o))
  :: true -> deliver(o, k, w, view); printf("STEP %d webhook_again %d %d\nSTATE %d %d %d %d %d\n", o, k, w, SHOWN(o))
  :: notes[SI(o, k)] = notes[SI(o, k)] & ~w; printf("STEP %d webhook_lost %d %d\nSTATE %d %d %d %d %d\n", o, k, w, SHOWN(o))
  fi;
  w = 0; view = 0
}

proctype webhooks(byte o) {
  byte w, view;
end:
  do
  :: atomic { notes[SI(o, 0)] != 0 -> notice(o, 0) }
#if MAXS > 1
  :: atomic { notes[SI(o, 1)] != 0 -> notice(o, 1) }
#endif
  od
}

/* --- the order's deadline (orders.cancel.expire_unpaid_order), one command row, atomic --- */
proctype deadline_of(byte o) {
end:
  do
  :: atomic { deadline[o] && UNPAID(o) -> t_cancel(o); printf("STEP %d deadline\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  :: atomic { deadline[o] && st[o] == INITIATED && sess[CUR(o)] != S_OPEN ->
       /* waits for its session's expires_at, asks the provider and applies the answer */
       apply(o, psess[o] - 1, sess[CUR(o)], 0); deadline[o] = 0; printf("STEP %d deadline_asks\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
#if HOLD
  /* the hold's own (payments.holds.end_hold), a margin before it lapses: leaves an order being captured */
  :: atomic { hold_dl[o] && st[o] == AUTHORIZED ->
       if
       :: !capreq[o] -> t_cancel_held(o)
       :: else -> skip
       fi;
       hold_dl[o] = 0; printf("STEP %d hold_deadline\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
#endif
  od
}

/* A complete session not paid: the late-money pass asks again later (a hold, or one that ended). */
#define SETTLING(o) (sess[CUR(o)] == S_HELD || sess[CUR(o)] == S_VOID || sess[CUR(o)] == S_CAPT)

/* --- the reconciliation sweep (scheduling.sweep): expiry pass, provider pass, the watch of a
   cancelled order's late money --- */
proctype sweep(byte o) {
end:
  do
  :: atomic { UNPAID(o) -> t_cancel(o); printf("STEP %d sweep_expires\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  :: atomic { st[o] == INITIATED && sess[CUR(o)] != S_OPEN && sess[CUR(o)] != S_PROC ->
       apply(o, psess[o] - 1, sess[CUR(o)], 0); printf("STEP %d sweep_asks\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  :: atomic { st[o] == CANCELLED && watch[o] && sess[CUR(o)] != S_OPEN && sess[CUR(o)] != S_PROC && !SETTLING(o) ->
       if
       :: sess[CUR(o)] == S_PAID ->
            apply(o, psess[o] - 1, S_PAID, 0);
            if
            :: provider_refunds[CUR(o)] > 0 -> watch[o] = 0    /* its refund went through */
            :: else -> skip
            fi
       :: else -> watch[o] = 0                                  /* failed or expired: nothing can come */
       fi;
       printf("STEP %d sweep_watch\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  od
}

/* refund_payment: the provider refunds once per Idempotency-Key (order, session, attempt). */
inline refund_at_provider(o, k) {
  if
  :: provider_refunds[SI(o, k)] == 0 -> provider_refunds[SI(o, k)] = 1; printf("STEP %d refunded %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
  :: else -> skip    /* the key replayed */
  fi
}
/* ... then the command is marked done in its own commit; a crash before it: run again. */
inline refund_done(o, k) {
  if
  :: !crashed -> crashed = 1
  :: refund_cmd[SI(o, k)] = 0
  fi;
  k = 0
}

/* The capture command (orders.fulfilment.execute_capture): the hold taken under its own
   idempotency key (once, however often it runs), then, in the runner's commit, the order Paid and
   shipped; a capture the provider refuses (the hold ended) is a dead letter whose commit cancels
   the order as its lapse does (payments.holds.capture_refused); money taken for an order that
   moved meanwhile is a dead letter too. */
inline capture_at_provider(o) {
  was = st[o];
  if
  :: was == AUTHORIZED && sess[CUR(o)] == S_HELD -> sess[CUR(o)] = S_CAPT; captures[CUR(o)]++
  :: was == AUTHORIZED && sess[CUR(o)] == S_CAPT -> skip      /* the key replayed */
  :: was == AUTHORIZED && sess[CUR(o)] == S_VOID -> capcmd[o] = C_DEAD
  :: was != AUTHORIZED -> skip
  fi;
  printf("STEP %d capture\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
}
inline capture_commit(o) {
  if
  :: capcmd[o] == C_DEAD && st[o] == AUTHORIZED -> t_cancel_held(o)
  :: capcmd[o] == C_DEAD && st[o] != AUTHORIZED -> skip     /* the lapse's notice cancelled it first */
  :: capcmd[o] != C_DEAD && !crashed -> crashed = 1; printf("STEP %d capture_crashed\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
  :: capcmd[o] != C_DEAD && st[o] == AUTHORIZED ->
       st[o] = PAID; BUMP(o); was_paid[o] = 1; shipped[o] = 1; hold_dl[o] = 0; capcmd[o] = C_DONE;
       printf("STEP %d captured\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
  :: capcmd[o] != C_DEAD && st[o] != AUTHORIZED && was == AUTHORIZED -> capcmd[o] = C_DEAD   /* taken, the order moved */
  :: capcmd[o] != C_DEAD && st[o] != AUTHORIZED && was != AUTHORIZED -> capcmd[o] = C_DONE
  fi;
  was = 0
}
/* The void command (payments.holds.execute_void): a hold still held is voided; one that ended
   or was captured is done, or a dead letter. */
inline void_at_provider(o, k) {
  if
  :: sess[SI(o, k)] == S_HELD -> sess[SI(o, k)] = S_VOID; voided[SI(o, k)] = 1; notes[SI(o, k)] = notes[SI(o, k)] | W_CANCELED
  :: else -> skip
  fi;
  voidcmd[SI(o, k)] = 0; printf("STEP %d voided %d\nSTATE %d %d %d %d %d\n", o, k, SHOWN(o))
}

/* --- an outbox worker: the compensation (saga.inventory.restore_inventory) and the late-money
   refund command, each delivered at least once; a crash between the read and the commit leaves
   the delivery to be retried, and a lapsed lease lets the other worker run it concurrently --- */
proctype worker(byte o; byte r) {
  byte was, k;
  bit marker, crashed;
end:
  do
  :: atomic { restore[o] == D_PENDING -> READ(o, r); marker = MARKER_SET(o); was = st[o] }
     if
     :: r == R_WORKER && !crashed -> crashed = 1; printf("STEP %d restore_crashed\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
     :: atomic {
          if
          :: marker || was != CANCELLED -> restore[o] = D_DONE      /* nothing to give back */
          :: !marker && was == CANCELLED && SAVE_GUARD(o, r) ->
               MARK_RESTORED(o); onhand++; gave[o]++; restore[o] = D_DONE; printf("STEP %d restored\nSTATE %d %d %d %d %d\n", o, SHOWN(o))
          :: !marker && was == CANCELLED && !SAVE_GUARD(o, r) -> skip   /* LostRace: retried */
          fi
        }
     fi;
     atomic { DONE_READING(o, r); marker = 0; was = 0 }
  :: atomic { r == R_WORKER && refund_cmd[SI(o, 0)] -> k = 0; refund_at_provider(o, 0) }
     refund_done(o, k)
#if MAXS > 1
  :: atomic { r == R_WORKER && refund_cmd[SI(o, 1)] -> k = 1; refund_at_provider(o, 1) }
     refund_done(o, k)
#endif
#if HOLD
  :: atomic { r == R_WORKER && capcmd[o] == C_PENDING -> capture_at_provider(o) }
     atomic { capture_commit(o) }
  :: atomic { r == R_WORKER && voidcmd[SI(o, 0)] -> void_at_provider(o, 0) }
#if MAXS > 1
  :: atomic { r == R_WORKER && voidcmd[SI(o, 1)] -> void_at_provider(o, 1) }
#endif
#endif
  od
}

/* --- an operator refunds a paid order, with or without its stock back (saga.operator_refunds) --- */
proctype operator(byte o) {
#if HOLD
  /* ships a held order (the capture asked once: orders.fulfilment), or cancels it (the console's
     cancel: cancel_held in one transaction) */
end_held:
  if
  :: atomic { st[o] == AUTHORIZED && !capreq[o] -> NOTE_CAPTURE(o); capcmd[o] = C_PENDING; printf("STEP %d ship\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  :: atomic { st[o] == AUTHORIZED && !capreq[o] -> t_cancel_held(o); printf("STEP %d operator_cancel\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  fi
#else
end:
  if
  :: atomic { st[o] == PAID ->
       op_refunded[o] = 1;
       if
       :: !MARKER_SET(o) -> MARK_RESTORED(o); onhand++; gave[o]++    /* restock_paid: the same marker */
       :: else -> skip
       fi;
       printf("STEP %d operator_restock\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  :: atomic { st[o] == PAID -> op_refunded[o] = 1; printf("STEP %d operator_refund\nSTATE %d %d %d %d %d\n", o, SHOWN(o)) }
  fi
#endif
}

/* --- the guarantees (docs/REFERENCE.md, Guarantees) --- */

#define HELD1(o) (placed[o] && !restored[o] -> 1 : 0)
#if N == 1
#define HELD HELD1(0)
#elif N == 2
#define HELD (HELD1(0) + HELD1(1))
#elif N == 3
#define HELD (HELD1(0) + HELD1(1) + HELD1(2))
#endif

/* Late money of session i of order o: paid at the provider, and not the payment the order kept. */
#define LATE(o, k) (sess[SI(o, k)] == S_PAID && !(st[o] == PAID && psess[o] == k + 1))
#define REFUND_OK(o, k) (provider_refunds[SI(o, k)] <= 1 && (provider_refunds[SI(o, k)] == 0 || LATE(o, k)))
#if MAXS > 1
#define REFUNDS_OK(o) (REFUND_OK(o, 0) && REFUND_OK(o, 1))
#define REFUNDED(o) ((!LATE(o, 0) || provider_refunds[SI(o, 0)] == 1) && (!LATE(o, 1) || provider_refunds[SI(o, 1)] == 1))
#else
#define REFUNDS_OK(o) REFUND_OK(o, 0)
#define REFUNDED(o) (!LATE(o, 0) || provider_refunds[SI(o, 0)] == 1)
#endif
/* A hold: taken at most once, never both taken and voided, never refunded (voided instead),
   never taken for a cancelled order; a shipped order's hold was taken. */
#define HOLD_OK(o, k) (captures[SI(o, k)] <= 1 && !(captures[SI(o, k)] > 0 && voided[SI(o, k)]) && \
  !(was_held[SI(o, k)] && (refund_row[SI(o, k)] || provider_refunds[SI(o, k)] > 0)) && \
  !(captures[SI(o, k)] > 0 && st[o] == CANCELLED))
#if MAXS > 1
#define HOLDS_OK(o) (HOLD_OK(o, 0) && HOLD_OK(o, 1))
#else
#define HOLDS_OK(o) HOLD_OK(o, 0)
#endif
#define SHIP_OK(o) (!shipped[o] || sess[CUR(o)] == S_CAPT)
#define ORDER_OK(o) (gave[o] <= 1 && !(was_paid[o] && was_cancelled[o]) && REFUNDS_OK(o) && HOLDS_OK(o) && SHIP_OK(o))
/* Final: Paid, Cancelled or rejected; a held order whose capture was refused too (its hold ended). */
#define FINAL(o) (st[o] == PAID || st[o] == CANCELLED || st[o] == REJECTED)
/* With holds, every Paid order was paid by its capture at a ship. */
#define SHIPPED(o) (!HOLD || st[o] != PAID || shipped[o])
#define RESTOCKED(o) (st[o] != CANCELLED || (restored[o] && gave[o] == 1))

#if N == 1
#define ALL(P) (P(0))
#elif N == 2
#define ALL(P) (P(0) && P(1))
#elif N == 3
#define ALL(P) (P(0) && P(1) && P(2))
#endif

/* No oversell; conservation: on hand + held by orders (placed, stock not given back) == initial. */
#define SAFE (onhand >= 0 && onhand + HELD == STOCK && ALL(ORDER_OK))

active proctype guarantees() {
end:
  atomic { !SAFE -> assert(SAFE) }
}

/* Once nothing can move: every order final, a cancelled order's stock back once, late money
   refunded once. */
active proctype quiet() {
  timeout -> assert(ALL(FINAL) && ALL(RESTOCKED) && ALL(REFUNDED) && ALL(SHIPPED))
}

init {
  byte o;
  atomic {
    for (o : 0 .. N - 1) {
      run customer(o); run provider(o); run webhooks(o); run deadline_of(o); run sweep(o);
      run worker(o, R_WORKER);
#if !HOLD
      run worker(o, R_TWIN);    /* the compensation's second delivery: the checkout mode's runs */
#endif
      run operator(o)
    }
  }
}

/* Liveness, under weak fairness (pan -a -f): each is checked on its own (pan -N name). */
ltl final { <> [] ALL(FINAL) }
ltl restock { <> [] ALL(RESTOCKED) }
ltl refund { <> [] ALL(REFUNDED) }
