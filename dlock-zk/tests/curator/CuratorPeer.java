// A Curator contender for dlock-zk's interop tests (tests/curator.rs), driven line by line.
//
// Usage: java CuratorPeer <connect> latch <path>
//        java CuratorPeer <connect> rw <path>
//        java CuratorPeer <connect> semaphore <path> <maxLeases>
//
// Once its Curator client is connected the peer prints READY, then answers each command read
// from stdin with one line on stdout. Every contender is named by a handle chosen by the test,
// so one peer can run several contenders on the one path:
//
//   latch:     start <h> <participant id>  -> STARTED <h>
//              await <h> <ms>              -> LEADER <h> | TIMEOUT <h>
//              state <h>                   -> STATE <h> has=<bool> gained=<n> lost=<n>
//              leader <h>                  -> LEADER_ID <h> <id> | NO_LEADER <h>
//              close <h>                   -> CLOSED <h>
//   rw:        read <h> <ms> | write <h> <ms>  -> ACQUIRED <h> | TIMEOUT <h>
//              release <h>                 -> RELEASED <h>
//   semaphore: acquire <h> <ms>            -> ACQUIRED <h> | TIMEOUT <h>
//              release <h>                 -> RELEASED <h>
//   any:       quit                        -> BYE (then the peer exits)
//
// Commands run one at a time on the main thread (Curator's read-write lock belongs to the
// thread that took it), so an acquire blocks the peer until it is granted or times out. A
// command that fails prints ERROR <what>; the test treats that as a failure.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorPeer {
    /** One started latch and what its listener saw. */
    private static final class Latch {
        final LeaderLatch latch;
        final AtomicInteger gained = new AtomicInteger();
        final AtomicInteger lost = new AtomicInteger();

        Latch(LeaderLatch latch) {
            this.latch = latch;
        }
    }

    private final CuratorFramework client;
    private final String kind;
    private final String path;
    private final Map<String, Latch> latches = new HashMap<>();
    private final Map<String, InterProcessMutex> heldLocks = new HashMap<>();
    private final Map<String, Lease> heldLeases = new HashMap<>();
    private final InterProcessSemaphoreV2 semaphore;

    private CuratorPeer(CuratorFramework client, String kind, String path, int maxLeases) {
        this.client = client;
        this.kind = kind;
        this.path = path;
        this.semaphore =
                kind.equals("semaphore") ? new InterProcessSemaphoreV2(client, path, maxLeases) : null;
    }

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            say("ERROR usage: CuratorPeer <connect> latch|rw|semaphore <path> [maxLeases]");
            System.exit(2);
        }
        String kind = args[1];
        int maxLeases = 0;
        if (kind.equals("semaphore")) {
            if (args.length < 4) {
                say("ERROR a semaphore needs maxLeases");
                System.exit(2);
            }
            maxLeases = Integer.parseInt(args[3]);
        } else if (!kind.equals("latch") && !kind.equals("rw")) {
            say("ERROR unknown primitive " + kind);
            System.exit(2);
        }
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 15_000, 15_000, new RetryNTimes(10, 200));
        client.start();
        if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        CuratorPeer peer = new CuratorPeer(client, kind, args[2], maxLeases);
        say("READY");
        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.isEmpty()) {
                continue;
            }
            if (line.equals("quit")) {
                break;
            }
            try {
                say(peer.run(line.split(" ")));
            } catch (Exception e) {
                say("ERROR " + line + ": " + e);
            }
        }
        peer.shutdown();
        say("BYE");
    }

    private String run(String[] cmd) throws Exception {
        String op = cmd[0];
        if (cmd.length < 2) {
            throw new IllegalArgumentException("no handle");
        }
        String h = cmd[1];
        switch (kind) {
            case "latch":
                return latch(op, h, cmd);
            case "rw":
                return rw(op, h, cmd);
            default:
                return permit(op, h, cmd);
        }
    }

    private static long millis(String[] cmd) {
        if (cmd.length < 3) {
            throw new IllegalArgumentException("no wait in milliseconds");
        }
        return Long.parseLong(cmd[2]);
    }

    private Latch latchOf(String h) {
        Latch l = latches.get(h);
        if (l == null) {
            throw new IllegalStateException("no latch " + h);
        }
        return l;
    }

    private String latch(String op, String h, String[] cmd) throws Exception {
        switch (op) {
            case "start": {
                if (cmd.length < 3) {
                    throw new IllegalArgumentException("no participant id");
                }
                Latch l = new Latch(new LeaderLatch(client, path, cmd[2]));
                l.latch.addListener(new LeaderLatchListener() {
                    @Override
                    public void isLeader() {
                        l.gained.incrementAndGet();
                    }

                    @Override
                    public void notLeader() {
                        l.lost.incrementAndGet();
                    }
                });
                latches.put(h, l);
                l.latch.start();
                return "STARTED " + h;
            }
            case "await":
                return (latchOf(h).latch.await(millis(cmd), TimeUnit.MILLISECONDS) ? "LEADER " : "TIMEOUT ")
                        + h;
            case "state": {
                Latch l = latchOf(h);
                return "STATE " + h + " has=" + l.latch.hasLeadership() + " gained=" + l.gained.get()
                        + " lost=" + l.lost.get();
            }
            case "leader": {
                Participant p = latchOf(h).latch.getLeader();
                return p.isLeader() ? "LEADER_ID " + h + " " + p.getId() : "NO_LEADER " + h;
            }
            case "close":
                latches.remove(h).latch.close();
                return "CLOSED " + h;
            default:
                throw new IllegalArgumentException("unknown latch command " + op);
        }
    }

    private String rw(String op, String h, String[] cmd) throws Exception {
        switch (op) {
            case "read":
            case "write": {
                // A lock object per handle: Curator's mutexes are re-entrant per object and thread,
                // so two handles must not share one.
                InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
                InterProcessMutex m = op.equals("read") ? rw.readLock() : rw.writeLock();
                if (!m.acquire(millis(cmd), TimeUnit.MILLISECONDS)) {
                    return "TIMEOUT " + h;
                }
                heldLocks.put(h, m);
                return "ACQUIRED " + h;
            }
            case "release": {
                InterProcessMutex m = heldLocks.remove(h);
                if (m == null) {
                    throw new IllegalStateException("handle " + h + " holds nothing");
                }
                m.release();
                return "RELEASED " + h;
            }
            default:
                throw new IllegalArgumentException("unknown rw command " + op);
        }
    }

    private String permit(String op, String h, String[] cmd) throws Exception {
        switch (op) {
            case "acquire": {
                Lease lease = semaphore.acquire(millis(cmd), TimeUnit.MILLISECONDS);
                if (lease == null) {
                    return "TIMEOUT " + h;
                }
                heldLeases.put(h, lease);
                return "ACQUIRED " + h;
            }
            case "release": {
                Lease lease = heldLeases.remove(h);
                if (lease == null) {
                    throw new IllegalStateException("handle " + h + " holds nothing");
                }
                semaphore.returnLease(lease);
                return "RELEASED " + h;
            }
            default:
                throw new IllegalArgumentException("unknown semaphore command " + op);
        }
    }

    private void shutdown() {
        for (Latch l : latches.values()) {
            try {
                l.latch.close();
            } catch (Exception e) {
                // The session's end removes the node anyway.
            }
        }
        for (InterProcessMutex m : heldLocks.values()) {
            try {
                m.release();
            } catch (Exception e) {
                // As above.
            }
        }
        for (Lease lease : heldLeases.values()) {
            semaphore.returnLease(lease);
        }
        client.close();
    }
}
