/*
 * The pod sandbox ("pause") process of the local cluster: holds the pod's
 * namespaces, reaps zombies, exits cleanly on SIGINT/SIGTERM. Built as a
 * static binary by scripts/cluster/images.sh and wrapped as an OCI image by
 * scripts/cluster/oci_image.py (no registry on the internet is needed).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10-metax"

static void on_exit_signal(int sig) { _exit(0); }

static void on_child(int sig) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  struct sigaction sa;
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause version %s\n", VERSION);
    return 0;
  }
  if (getpid() != 1)
    fprintf(stderr, "Warning: pause should be the first process\n");

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_exit_signal;
  if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
    return 1;
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) < 0)
    return 2;

  for (;;)
    pause();
  fprintf(stderr, "Error: infinite loop terminated\n");
  return 42;
}
