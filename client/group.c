/*
 * group.c - a command's process group, from its start until nothing of it is left: how
 * baton lock and baton worker end the commands they run.
 *
 * Design. The command runs in a process group of its own, and every signal goes to the
 * whole group (killing only `sh -c` would leave its children running). Its runner is the
 * group's subreaper (prctl PR_SET_CHILD_SUBREAPER, set by the caller): the children the
 * command leaves behind become its own and are reaped here, so that the group's end
 * (kill(-pgid, 0) answering ESRCH) never waits for an init that does not reap. The group
 * is over only when nothing of it is left, not when its leader exits: a child that ignores
 * SIGTERM outlives the leader, and the SIGKILL due after the grace still reaches it.
 */
#include "client.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

void group_reap(struct group *g)
{
	int ws;
	pid_t w;
	int flags = WNOHANG | (g->untraced ? WUNTRACED | WCONTINUED : 0);
	while ((w = waitpid(-1, &ws, flags)) > 0) {
		if (w != g->pgid)
			continue;
		if (WIFSTOPPED(ws) || WIFCONTINUED(ws)) {
			g->stopped = WIFSTOPPED(ws);
			continue;
		}
		g->ws = ws;
		g->exited = 1;
	}
}

int group_left(const struct group *g)
{
	return kill(-g->pgid, 0) == 0 || errno == EPERM;
}

void group_signal(const struct group *g, int sig)
{
	kill(-g->pgid, sig);
	if (g->cont && sig != SIGKILL)
		kill(-g->pgid, SIGCONT);
}

void group_end(struct group *g, long long now, long long grace)
{
	if (g->ending)
		return;
	group_signal(g, SIGTERM);
	g->ending = 1;
	g->kill_at = now + grace;
}

void group_tick(struct group *g, long long now)
{
	if (g->ending == 1 && now >= g->kill_at) {
		kill(-g->pgid, SIGKILL);
		g->ending = 2;
	}
}

int group_status(const struct group *g)
{
	int ws = g->ws;
	return WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 1;
}
