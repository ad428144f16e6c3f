/* A fake host's own IP on the loopback ground: preloaded into a process
 * (LD_PRELOAD) with HV_TEST_SOURCE_IP set, every IPv4 TCP connection it
 * makes to 127.0.0.0/8 leaves from that address. Ceph then sees the host's
 * client at its own IP, as it would a real host's, and an OSD blocklist
 * entry for that IP cuts that host alone. Built by up.sh; the tests ask for
 * it per agent (AgentPeers::source_ip). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t);
  if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
  const char *src = getenv("HV_TEST_SOURCE_IP");
  if (src && addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    const struct sockaddr_in *to = (const struct sockaddr_in *)addr;
    int type = 0;
    socklen_t tl = sizeof type;
    if ((ntohl(to->sin_addr.s_addr) >> 24) == 127 &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM) {
      struct sockaddr_in from = {0};
      from.sin_family = AF_INET;
      /* A socket bound already fails this bind and stays as it was. */
      if (inet_pton(AF_INET, src, &from.sin_addr) == 1) bind(fd, (struct sockaddr *)&from, sizeof from);
    }
  }
  return real(fd, addr, len);
}
