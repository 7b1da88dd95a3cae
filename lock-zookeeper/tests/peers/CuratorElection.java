// A peer for lock-zookeeper's interop tests: the real Apache Curator LeaderSelector (Debian's
// libcurator-recipes-java), built on InterProcessMutex: its participant id is its lock node's
// data.
//
//   java -cp CP CuratorElection <connectString> <path> <id>
//
// Queues a LeaderSelector with participant id <id> on <path> and reads commands on stdin:
// "leader" prints "LEADER <id>" (getLeader()'s id; nothing after the space when nobody leads),
// "resign" ends its leadership and prints "RESIGNED" once its node is gone. It prints
// "ELECTED" when it takes the leadership. Exit codes: 0 ok (stdin closed), 2 usage, 1 error.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.ExponentialBackoffRetry;

public final class CuratorElection {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: CuratorElection <connectString> <path> <id>");
            System.exit(2);
        }
        String id = args[2];
        CuratorFramework c = CuratorFrameworkFactory.newClient(
                args[0], 10_000, 10_000, new ExponentialBackoffRetry(50, 5));
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("could not connect to " + args[0]);
            System.exit(1);
        }
        CountDownLatch resign = new CountDownLatch(1);
        LeaderSelector selector = new LeaderSelector(c, args[1], new LeaderSelectorListenerAdapter() {
            @Override
            public void takeLeadership(CuratorFramework client) throws Exception {
                // println is synchronized: the line never interleaves with the main thread's.
                System.out.println("ELECTED");
                System.out.flush();
                resign.await();
            }
        });
        selector.setId(id);
        selector.start();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            switch (line.trim()) {
                case "leader":
                    System.out.println("LEADER " + selector.getLeader().getId());
                    break;
                case "resign":
                    resign.countDown();
                    // The mutex is released once takeLeadership returns: done when no
                    // participant has our id any more.
                    while (selector.getParticipants().stream().map(Participant::getId).anyMatch(id::equals)) {
                        Thread.sleep(10);
                    }
                    System.out.println("RESIGNED");
                    break;
                default:
                    System.err.println("unknown command: " + line);
                    System.exit(2);
            }
            System.out.flush();
        }
        selector.close();
        c.close();
        System.exit(0);
    }
}
