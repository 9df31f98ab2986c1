/*
 * queue.h - helpers of the resource suites (see queue.c).
 */
#ifndef BATON_TEST_QUEUE_H
#define BATON_TEST_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "harness.h"

/* Decrefs the n workflows and frees the array. */
void queue_free_all(json_t **wfs, size_t n);
/* All events of the workflows `ids`, in seq order (seq is global). New reference. */
json_t *queue_merged_events(const hs_server *s, char **ids, size_t n);
bool queue_is_type(const json_t *ev, const char *type);
/* "wf#step#attempt": the identity of one attempt of one step. */
void queue_attempt_key(const json_t *ev, char *buf, size_t size);
/* Whether `events` hold an event of `type` for the attempt `key` (queue_attempt_key). */
bool queue_has_event(const json_t *events, const char *type, const char *key);
/*
 * Walks the merged `events` by seq and asserts one holder per resource: a lock_acquired
 * only when nobody holds it, a lock_released only by its holder. When `kill_ms` is not
 * HS_NO_TIME, the first event after it starts the restarted process's life: whoever held
 * a resource when it was killed must have a step_interrupted event (or have ended that
 * attempt before the kill). Returns how many grants it saw.
 */
size_t queue_assert_one_holder(const json_t *events, int64_t kill_ms);
/* A workflow body: `resource`, `steps` workers named "<id>-<i>" of `work_ms` each
 * (malloc'ed). */
char *queue_body(const char *id, const char *resource, int steps, int work_ms);
/* POSTs a workflow of single steps `work_ms` long each; asserts 201. */
void queue_submit(const hs_server *s, const char *id, const char *resource, int steps, int work_ms);
/* Waits until every workflow of `ids` is completed; returns their states (free with
 * queue_free_all). */
json_t **queue_wait_completed(const hs_server *s, char **ids, size_t n);
/* Waits until GET /resources/{resource} shows a holder and exactly `waiters` waiters. */
void queue_wait(const hs_server *s, const char *resource, size_t waiters);

#endif
