/** Loopback ports for the child servers rxrl starts (a Kafka broker, SkyRL's Tinker server). */
import { createServer } from 'node:net';

/** A TCP port free on 127.0.0.1 now (the OS picks it; another process may take it before it is used). */
export function freeLoopbackPort(): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
