/**
 * Call an agent through the gateway with the official A2A JavaScript SDK (@a2a-js/sdk).
 *
 *   npm install                          # @a2a-js/sdk, pinned in package.json
 *   node client.mjs                      # echo, "hello"
 *   node client.mjs shout 'hello there'  # another agent and text
 *   GATEWAY=https://127.0.0.1:8080 NODE_EXTRA_CA_CERTS=dev-certs/ca.pem node client.mjs
 *
 * The agent's card is read from the gateway (/a2a/agents/<name>/card); the SDK's
 * ClientFactory picks the card's JSON-RPC interface, whose URL points back at the gateway.
 */

import { randomUUID } from 'node:crypto';

import { Role, TaskState } from '@a2a-js/sdk';
import { ClientFactory } from '@a2a-js/sdk/client';

const gateway = process.env.GATEWAY ?? 'http://127.0.0.1:8080';
const [agent = 'echo', text = 'hello'] = process.argv.slice(2);

const client = await new ClientFactory().createFromUrl(gateway, `/a2a/agents/${agent}/card`);
const textOf = (parts) =>
  (parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('');

const result = await client.sendMessage({
  tenant: '',
  message: {
    messageId: randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: '' }],
    taskId: '',
    contextId: '',
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  },
  configuration: undefined,
  metadata: undefined,
});

if ('status' in result) {
  const said = (result.artifacts ?? []).map((a) => textOf(a.parts)).join('');
  console.log(`task ${result.id}: ${TaskState[result.status.state]} ${JSON.stringify(said)}`);
} else {
  console.log(`message: ${JSON.stringify(textOf(result.parts))}`);
}
