"""A resident command server: ``stepsim server start`` keeps one process with stepsim loaded, and later
commands of the same environment run in a fork of it instead of starting from nothing.

Why: a command spends about half a second before it does any work. Importing numba and numpy takes
0.3-0.6 s on a 2-core EPYC (the machine's speed varies), stepsim's modules and loading the engine kernels from
numba's cache 0.1-0.2 s more, sympy and pyarrow (imported when a command needs them) 0.3-0.5 s, while a small
simulation takes milliseconds. The same remedy as Gradle's daemon or Nailgun: pay those costs once, in a process that
stays, and fork it per command (about 10 ms). A forked command starts from the server's state right after its
preload, never from another command's leftovers, so its output is the same as in a fresh process.

How a command gets there (:mod:`stepsim.server.client`): the ``stepsim`` program computes a fingerprint of
everything that decides what a process would load (Python, ``sys.path`` and the mtimes of its folders,
stepsim's files, the ``NUMBA_*``, ``STEPSIM_*`` and ``PYTHON*`` variables, ...) and looks for a server socket of
that name in a private folder. Without one, or with ``STEPSIM_SERVER=off``, the command runs in its own process
as before. With one, it sends its arguments, working directory, environment, umask and its stdin, stdout and
stderr (the file descriptors themselves, ``SCM_RIGHTS``) and waits for the exit status; Ctrl-C and SIGTERM are
passed on. Changed code or a changed environment simply gives another fingerprint, so a stale server is never
used; it ends after its idle timeout.

POSIX only (Unix sockets and descriptor passing); elsewhere every command runs in its own process.
"""
