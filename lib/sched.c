/*
 * sched.c - the step threads.
 *
 * Design (after redis bio.c): one job queue guarded by a mutex and a condition
 * variable; each thread pops a job, unlocks, runs it, and goes back for the next. The
 * engine submits a job only for a step that holds its resource, so the number of
 * threads bounds the steps running at once and a step waiting for a resource or a retry
 * holds no thread. Simulated work sleeps through sched_sleep, which sched_abort cuts
 * short when the engine stops; sched_drain lets shutdown wait for running steps.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

typedef struct job {
	sched_job_fn fn;
	void *arg;
	struct job *next;
} job;

struct sched {
	pthread_mutex_t mu;
	pthread_cond_t work;  /* a job was queued, or stopping */
	pthread_cond_t idle;  /* a job finished */
	pthread_cond_t sleep; /* sched_abort */
	job *head, *tail;
	int running; /* jobs being run */
	int stopping, aborted;
	int nthreads;
	pthread_t *threads;
};

static void *thread_main(void *arg)
{
	sched *s = arg;
	pthread_setname_np(pthread_self(), "baton-step");
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stopping)
			pthread_cond_wait(&s->work, &s->mu);
		if (!s->head)
			break;
		job *j = s->head;
		s->head = j->next;
		if (!s->head)
			s->tail = NULL;
		s->running++;
		pthread_mutex_unlock(&s->mu);
		j->fn(j->arg, s);
		free(j);
		pthread_mutex_lock(&s->mu);
		s->running--;
		pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

sched *sched_new(int threads)
{
	sched *s = xcalloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	cond_init_monotonic(&s->idle);
	cond_init_monotonic(&s->sleep);
	s->threads = xcalloc((size_t)threads, sizeof *s->threads);
	for (int i = 0; i < threads; i++) {
		if (pthread_create(&s->threads[i], NULL, thread_main, s) != 0)
			break;
		s->nthreads++;
	}
	if (s->nthreads == 0) {
		sched_free(s);
		return NULL;
	}
	return s;
}

void sched_submit(sched *s, sched_job_fn fn, void *arg)
{
	job *j = xcalloc(1, sizeof *j);
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = j;
	else
		s->head = j;
	s->tail = j;
	pthread_mutex_unlock(&s->mu);
	/* After the unlock, as eng_post: a step thread woken does not block on the mutex. */
	pthread_cond_signal(&s->work);
}

static struct timespec deadline_after(int64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

int sched_sleep(sched *s, int64_t ms)
{
	if (ms <= 0) /* nothing to wait for: no system call */
		return sched_aborted(s);
	struct timespec until = deadline_after(ms);
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	while (!s->aborted && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&s->sleep, &s->mu, &until);
	int aborted = s->aborted;
	pthread_mutex_unlock(&s->mu);
	return aborted;
}

int sched_aborted(sched *s)
{
	pthread_mutex_lock(&s->mu);
	int a = s->aborted;
	pthread_mutex_unlock(&s->mu);
	return a;
}

void sched_abort(sched *s)
{
	pthread_mutex_lock(&s->mu);
	s->aborted = 1;
	pthread_cond_broadcast(&s->sleep);
	pthread_mutex_unlock(&s->mu);
}

int sched_drain(sched *s, int64_t timeout_ms)
{
	struct timespec until = deadline_after(timeout_ms);
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	while ((s->running || s->head) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&s->idle, &s->mu, &until);
	int busy = s->running || s->head;
	pthread_mutex_unlock(&s->mu);
	return busy;
}

void sched_free(sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = 1;
	s->aborted = 1;
	/* Jobs not yet started are dropped: their steps resume after the next open. */
	while (s->head) {
		job *j = s->head;
		s->head = j->next;
		free(j->arg);
		free(j);
	}
	s->tail = NULL;
	pthread_cond_broadcast(&s->work);
	pthread_cond_broadcast(&s->sleep);
	pthread_mutex_unlock(&s->mu);
	for (int i = 0; i < s->nthreads; i++)
		pthread_join(s->threads[i], NULL);
	free(s->threads);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->idle);
	pthread_cond_destroy(&s->sleep);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
