/* The statement tracer's own cost without a server's noise: a process that answers the client/server protocol as
 * MariaDB reads it (a recv that finds nothing yet, a poll, the recv of the whole request, one send of an OK), and a
 * client process of its own (forked: not traced) sending THREADS connections' requests over socket pairs, one at a
 * time each, for SECS seconds. Prints "server PID" first (for `myprobe queries --any-process -p PID`), then
 * "statements N per_second R" at the end.
 *   wire THREADS SECS [TEXT]     TEXT: the COM_QUERY sent (default "SELECT 1")
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64

static const unsigned char OK[] = { 7, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0 };
static atomic_ulong served;
static atomic_int stop;

static void *serve(void *arg)
{
	int fd = (int)(long)arg;
	unsigned char buf[16384];
	while (!atomic_load(&stop)) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			poll(&p, 1, 100);
			continue;
		}
		if (n <= 0)
			break;
		unsigned char reply[sizeof(OK)];
		memcpy(reply, OK, sizeof(OK));
		reply[3] = buf[3] + 1;
		if (send(fd, reply, sizeof(reply), 0) != (ssize_t)sizeof(reply))
			break;
		atomic_fetch_add(&served, 1);
	}
	return NULL;
}

static void client(int fd, const char *text, int secs)
{
	size_t len = strlen(text) + 1;
	unsigned char req[4096];
	req[0] = len & 0xff;
	req[1] = (len >> 8) & 0xff;
	req[2] = (len >> 16) & 0xff;
	req[3] = 0;
	req[4] = 3; /* COM_QUERY */
	memcpy(req + 5, text, len - 1);
	time_t end = time(NULL) + secs;
	unsigned char reply[64];
	while (time(NULL) < end) {
		if (send(fd, req, 4 + len, 0) < 0 || recv(fd, reply, sizeof(reply), 0) <= 0)
			break;
	}
	close(fd);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: wire THREADS SECS [TEXT]\n");
		return 2;
	}
	int threads = atoi(argv[1]), secs = atoi(argv[2]);
	const char *text = argc > 3 ? argv[3] : "SELECT 1";
	if (threads < 1 || threads > MAX_THREADS || secs < 1 || strlen(text) > 4000) {
		fprintf(stderr, "wire: THREADS 1-%d, SECS >= 1, TEXT < 4000 bytes\n", MAX_THREADS);
		return 2;
	}
	int pairs[MAX_THREADS][2];
	for (int i = 0; i < threads; i++)
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, pairs[i])) {
			perror("socketpair");
			return 1;
		}
	printf("server %d\n", getpid());
	fflush(stdout);
	/* The tracer attaches meanwhile. */
	sleep(2);
	pid_t pid = fork();
	if (pid == 0) {
		pid_t kids[MAX_THREADS];
		for (int i = 0; i < threads; i++) {
			kids[i] = fork();
			if (kids[i] == 0) {
				client(pairs[i][1], text, secs);
				_exit(0);
			}
		}
		for (int i = 0; i < threads; i++)
			waitpid(kids[i], NULL, 0);
		_exit(0);
	}
	pthread_t t[MAX_THREADS];
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < threads; i++) {
		close(pairs[i][1]);
		pthread_create(&t[i], NULL, serve, (void *)(long)pairs[i][0]);
	}
	waitpid(pid, NULL, 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	atomic_store(&stop, 1);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double took = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
	unsigned long n = atomic_load(&served);
	printf("statements %lu per_second %.0f\n", n, n / took);
	return 0;
}
