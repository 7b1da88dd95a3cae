// The Curator side of fencelock-zookeeper's election bench (bench/benches/zookeeper-election.rs): Apache
// Curator's LeaderSelector (Debian's libcurator-recipes-java), timed in this JVM with
// System.nanoTime by the same trial the Rust side times its own election with. The bench
// compiles this file with javac and runs it once for the whole run (so its JIT stays warm),
// taking commands on stdin and answering each with one line on stdout; a second mode runs a
// leader alone, in a JVM of its own, for the bench to SIGKILL.
//
//   java -cp CP CuratorElectionBench <connectString> <clients>
//       opens <clients> CuratorFrameworks (one ZooKeeper session each, 10 s), prints "READY".
//   trial <path> <n> <parkMs>
//       n trials, as the Rust side's: client 0's LeaderSelector leads with nobody queued; an
//       observer (a CuratorCache on <path>, client 3) names it; clients 1 and 2 start their
//       LeaderSelectors, each once the one before is a participant; then twice: <parkMs> later, the leader's takeLeadership
//       is told to return (the time noted), and a sample is that time to the next
//       selector's takeLeadership being called. The observer's samples: from each of those
//       times to the cache's listener first naming the new leader (the lowest-sequence
//       child's data: the participant id). Then 3 getLeader() calls on client 3, timed.
//       Answers "OK <handover ns>... | <observe ns>... | <getLeader ns>...".
//   failover <path>
//       client 1's LeaderSelector queues behind a leader (another process); prints "QUEUED"
//       once its node is a participant, then "OK" as soon as takeLeadership is called, and
//       gives the leadership up.
//   quit
// Errors answer "ERROR <what>".
//
//   java -cp CP CuratorElectionBench leader <connectString> <path> <sessionMs>
//       one CuratorFramework with a session of <sessionMs>; its LeaderSelector prints
//       "leading" from takeLeadership and holds it until the process is killed.
// Exit codes: 0 after quit, 2 usage, 1 could not connect.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.cache.ChildData;
import org.apache.curator.framework.recipes.cache.CuratorCache;
import org.apache.curator.framework.recipes.cache.CuratorCacheListener;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.StandardLockInternalsDriver;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.utils.ZKPaths;

public final class CuratorElectionBench {
    static final String[] IDS = { "leader-a", "candidate-b", "candidate-c" };
    static final int READS = 3;
    static final long PATIENCE_S = 30;

    public static void main(String[] args) throws Exception {
        if (args.length == 4 && args[0].equals("leader")) {
            leader(args[1], args[2], Integer.parseInt(args[3]));
            return;
        }
        if (args.length != 2) {
            System.err.println("usage: CuratorElectionBench <connectString> <clients>");
            System.exit(2);
        }
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < Integer.parseInt(args[1]); i++) {
            clients.add(connect(args[0], 10_000));
        }
        System.out.println("READY");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            String[] words = line.trim().split(" ");
            if (words[0].equals("quit")) {
                break;
            }
            String answer;
            try {
                switch (words[0]) {
                    case "trial":
                        answer = trials(clients, words[1], Integer.parseInt(words[2]), Long.parseLong(words[3]));
                        break;
                    case "failover":
                        failover(clients.get(1), words[1]);
                        answer = null;
                        break;
                    default:
                        throw new IllegalArgumentException("unknown command " + words[0]);
                }
            } catch (Exception e) {
                answer = "ERROR " + String.valueOf(e).replace('\n', ' ');
            }
            if (answer != null) {
                System.out.println(answer);
                System.out.flush();
            }
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        System.exit(0);
    }

    static CuratorFramework connect(String connectString, int sessionMs) throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.newClient(
                connectString, sessionMs, Math.min(sessionMs, 10_000), new ExponentialBackoffRetry(50, 5));
        c.start();
        if (!c.blockUntilConnected(15, TimeUnit.SECONDS)) {
            System.err.println("could not connect to " + connectString);
            System.exit(1);
        }
        return c;
    }

    /** A selector whose takeLeadership notes the time, counts `elected` down and holds until `resign`. */
    static LeaderSelector selector(CuratorFramework client, String path, String id, long[] ledAt,
            int slot, CountDownLatch elected, CountDownLatch resign) {
        LeaderSelector s = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework c) throws Exception {
                ledAt[slot] = System.nanoTime();
                elected.countDown();
                resign.await();
            }
        });
        s.setId(id);
        return s;
    }

    static void await(CountDownLatch latch, String what) throws Exception {
        if (!latch.await(PATIENCE_S, TimeUnit.SECONDS)) {
            throw new IllegalStateException("timed out waiting for " + what);
        }
    }

    /** The observer: the leader as a CuratorCache on the election path shows it. */
    static final class Observer {
        final String path;
        final CuratorCache cache;
        final long[] namedAt = new long[IDS.length];
        final CountDownLatch[] named = { new CountDownLatch(1), new CountDownLatch(1), new CountDownLatch(1) };
        String leader;
        String failure;

        Observer(CuratorFramework client, String path) {
            this.path = path;
            cache = CuratorCache.build(client, path);
            cache.listenable().addListener(CuratorCacheListener.builder()
                    .forAll((type, before, after) -> changed())
                    .forInitialized(this::changed)
                    .build());
        }

        /** The participant id of the oldest lock node under the path, as LeaderSelector orders them. */
        String current() {
            ChildData oldest = null;
            String oldestSequence = null;
            for (ChildData d : (Iterable<ChildData>) cache.stream()::iterator) {
                ZKPaths.PathAndNode parts = ZKPaths.getPathAndNode(d.getPath());
                if (!parts.getPath().equals(path) || !parts.getNode().contains("lock-")) {
                    continue;
                }
                String sequence = StandardLockInternalsDriver.standardFixForSorting(parts.getNode(), "lock-");
                if (oldestSequence == null || sequence.compareTo(oldestSequence) < 0) {
                    oldest = d;
                    oldestSequence = sequence;
                }
            }
            return oldest == null || oldest.getData() == null ? null : new String(oldest.getData(), StandardCharsets.UTF_8);
        }

        synchronized void changed() {
            long now = System.nanoTime();
            String next = current();
            if (next == null || next.equals(leader)) {
                return;
            }
            leader = next;
            for (int i = 0; i < IDS.length; i++) {
                if (IDS[i].equals(next) && named[i].getCount() > 0) {
                    // Named out of order: it skipped the one before.
                    if (i > 0 && named[i - 1].getCount() > 0) {
                        failure = "the observer skipped " + IDS[i - 1];
                    }
                    namedAt[i] = now;
                    named[i].countDown();
                }
            }
        }
    }

    static String trials(List<CuratorFramework> clients, String path, int n, long parkMs) throws Exception {
        StringBuilder handovers = new StringBuilder();
        StringBuilder observed = new StringBuilder();
        StringBuilder reads = new StringBuilder();
        // Never started: only its getLeader() is used, a read of the participants.
        LeaderSelector probe = new LeaderSelector(clients.get(3), path, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework c) {
            }
        });
        for (int t = 0; t < n; t++) {
            long[] ledAt = new long[IDS.length];
            CountDownLatch[] elected = new CountDownLatch[IDS.length];
            CountDownLatch[] resign = new CountDownLatch[IDS.length];
            LeaderSelector[] selectors = new LeaderSelector[IDS.length];
            for (int i = 0; i < IDS.length; i++) {
                elected[i] = new CountDownLatch(1);
                resign[i] = new CountDownLatch(1);
                selectors[i] = selector(clients.get(i), path, IDS[i], ledAt, i, elected[i], resign[i]);
            }
            selectors[0].start();
            await(elected[0], "the leader");
            Observer observer = new Observer(clients.get(3), path);
            observer.cache.start();
            await(observer.named[0], "the observer to name the leader");
            // Queued in this order, as the Rust side waits for each node in the queue.
            for (int i = 1; i < IDS.length; i++) {
                selectors[i].start();
                while (probe.getParticipants().size() < i + 1) {
                    Thread.sleep(1);
                }
            }
            long[] resigned = new long[2];
            for (int i = 0; i < 2; i++) {
                Thread.sleep(parkMs);
                resigned[i] = System.nanoTime();
                resign[i].countDown();
                await(elected[i + 1], IDS[i + 1]);
                handovers.append(' ').append(ledAt[i + 1] - resigned[i]);
            }
            await(observer.named[2], "the observer to name " + IDS[2]);
            if (observer.failure != null) {
                throw new IllegalStateException(observer.failure);
            }
            for (int i = 0; i < 2; i++) {
                observed.append(' ').append(observer.namedAt[i + 1] - resigned[i]);
            }
            for (int i = 0; i < READS; i++) {
                long started = System.nanoTime();
                probe.getLeader();
                reads.append(' ').append(System.nanoTime() - started);
            }
            resign[2].countDown();
            for (LeaderSelector s : selectors) {
                s.close();
            }
            observer.cache.close();
            // The next trial starts on an empty election.
            while (!probe.getParticipants().isEmpty()) {
                Thread.sleep(1);
            }
        }
        return "OK" + handovers + " |" + observed + " |" + reads;
    }

    static void failover(CuratorFramework client, String path) throws Exception {
        long[] ledAt = new long[1];
        CountDownLatch elected = new CountDownLatch(1);
        CountDownLatch resign = new CountDownLatch(1);
        LeaderSelector s = selector(client, path, "successor", ledAt, 0, elected, resign);
        s.start();
        try {
            while (s.getParticipants().stream().map(Participant::getId).noneMatch("successor"::equals)) {
                Thread.sleep(1);
            }
            System.out.println("QUEUED");
            System.out.flush();
            // The leader's session has to expire first: up to its timeout and two ticks.
            if (!elected.await(120, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not elected within 120 s of the queue");
            }
            System.out.println("OK");
            System.out.flush();
        } finally {
            resign.countDown();
            s.close();
        }
    }

    static void leader(String connectString, String path, int sessionMs) throws Exception {
        CuratorFramework c = connect(connectString, sessionMs);
        LeaderSelector s = new LeaderSelector(c, path, new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework client) throws Exception {
                System.out.println("leading");
                System.out.flush();
                Thread.sleep(Long.MAX_VALUE);
            }
        });
        s.setId("killed");
        s.start();
        Thread.sleep(Long.MAX_VALUE);
    }
}
