/* The client of bench/protocols: THREADS connections each running a small CPU-bound statement (no table access)
 * for SECS seconds, over the unix socket, TCP, or (built with -DEMBEDDED, linked with libmariadbd) the embedded
 * server. Prints the statements completed in each second ("second N qps Q") and at the end "total_qps Q".
 *
 *   protocols socket PATH THREADS SECS
 *   protocols tcp HOST PORT THREADS SECS
 *   protocols-embedded embedded DATADIR THREADS SECS
 */
#include <mysql.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The seed's kind of statement: functions only, parsed and executed each time. */
static const char *QUERY = "SELECT CONCAT(UPPER('myprobe'), MD5('protocol'), LPAD(42, 8, '0'), 17 * 31 + 5)";

static const char *mode, *where, *host;
static unsigned port;
static atomic_ulong done;
static atomic_int stop;

static MYSQL *connect_one(void)
{
	MYSQL *m = mysql_init(NULL);
	if (!m)
		return NULL;
#ifdef EMBEDDED
	mysql_options(m, MYSQL_OPT_USE_EMBEDDED_CONNECTION, NULL);
	if (!mysql_real_connect(m, NULL, NULL, NULL, NULL, 0, NULL, 0))
		goto fail;
#else
	unsigned protocol = strcmp(mode, "tcp") == 0 ? MYSQL_PROTOCOL_TCP : MYSQL_PROTOCOL_SOCKET;
	mysql_options(m, MYSQL_OPT_PROTOCOL, &protocol);
	if (!mysql_real_connect(m, protocol == MYSQL_PROTOCOL_TCP ? host : "localhost", "root", NULL, NULL, port,
				protocol == MYSQL_PROTOCOL_SOCKET ? where : NULL, 0))
		goto fail;
#endif
	return m;
fail:
	fprintf(stderr, "protocols: cannot connect (%s): %s\n", mode, mysql_error(m));
	mysql_close(m);
	return NULL;
}

static void *worker(void *arg)
{
	(void)arg;
	mysql_thread_init();
	MYSQL *m = connect_one();
	if (!m) {
		atomic_store(&stop, 2);
		mysql_thread_end();
		return NULL;
	}
	while (!atomic_load(&stop)) {
		if (mysql_query(m, QUERY)) {
			fprintf(stderr, "protocols: %s\n", mysql_error(m));
			atomic_store(&stop, 2);
			break;
		}
		MYSQL_RES *r = mysql_store_result(m);
		mysql_free_result(r);
		atomic_fetch_add(&done, 1);
	}
	mysql_close(m);
	mysql_thread_end();
	return NULL;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int rest;
	if (argc == 5 && (strcmp(argv[1], "socket") == 0 || strcmp(argv[1], "embedded") == 0)) {
		rest = 3;
	} else if (argc == 6 && strcmp(argv[1], "tcp") == 0) {
		host = argv[2];
		port = (unsigned)atoi(argv[3]);
		rest = 4;
	} else {
		fprintf(stderr, "usage: protocols socket PATH|tcp HOST PORT|embedded DATADIR THREADS SECS\n");
		return 2;
	}
	mode = argv[1];
	where = argv[2];
	int threads = atoi(argv[rest]), secs = atoi(argv[rest + 1]);
	if (threads < 1 || threads > 256 || secs < 1) {
		fprintf(stderr, "protocols: THREADS 1..256, SECS >= 1\n");
		return 2;
	}
#ifdef EMBEDDED
	char datadir[4096];
	snprintf(datadir, sizeof(datadir), "--datadir=%s", where);
	char *server_args[] = {"protocols", datadir, "--skip-grant-tables", "--innodb-buffer-pool-size=16M",
			       "--skip-log-bin", NULL};
	char *groups[] = {"embedded", NULL};
	if (mysql_library_init(5, server_args, groups)) {
		fprintf(stderr, "protocols: the embedded server did not start\n");
		return 1;
	}
#else
	mysql_library_init(0, NULL, NULL);
#endif
	pthread_t t[256];
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	double start = now();
	unsigned long last = 0;
	for (int s = 1; s <= secs && atomic_load(&stop) != 2; s++) {
		double until = start + s;
		while (now() < until)
			usleep(2000);
		unsigned long d = atomic_load(&done);
		printf("second %d qps %lu\n", s, d - last);
		fflush(stdout);
		last = d;
	}
	double elapsed = now() - start;
	int failed = atomic_load(&stop) == 2;
	atomic_store(&stop, 1);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	printf("total_qps %.0f\n", atomic_load(&done) / elapsed);
	mysql_library_end();
	return failed;
}
