// A peer for lock-zookeeper's interop tests: the real Apache Curator InterProcessMutex
// (Debian's libcurator-recipes-java).
//
//   java -cp CP CuratorLock <connectString> <path>
//
// Acquires InterProcessMutex on <path> (blocking), prints "HELD <node name> <czxid>", waits for
// one line on stdin, releases, prints "RELEASED". Exit codes: 0 ok, 2 usage, 1 error.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.utils.ZKPaths;
import org.apache.zookeeper.data.Stat;

public final class CuratorLock {
    /** InterProcessMutex.getLockPath() is protected; expose it. */
    static final class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework c, String path) { super(c, path); }
        String ourPath() { return getLockPath(); }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: CuratorLock <connectString> <path>");
            System.exit(2);
        }
        CuratorFramework c = CuratorFrameworkFactory.newClient(
                args[0], 10_000, 10_000, new ExponentialBackoffRetry(50, 5));
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("could not connect to " + args[0]);
            System.exit(1);
        }
        Mutex m = new Mutex(c, args[1]);
        m.acquire();
        String ours = m.ourPath();
        Stat st = c.checkExists().forPath(ours);
        System.out.println("HELD " + ZKPaths.getNodeFromPath(ours) + " " + st.getCzxid());
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        m.release();
        System.out.println("RELEASED");
        System.out.flush();
        c.close();
        System.exit(0);
    }
}
