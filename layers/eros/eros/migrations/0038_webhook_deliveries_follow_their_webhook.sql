-- 0038 — a webhook's deliveries belong to the webhook (issue 32), and the daily pruning has an index.
--
-- 0037 tied a delivery to its app; deleting the app's webhook then left its deliveries to be sent to nowhere. Tied
-- to the webhook instead, deleting it deletes them (a drain writes a delivery only while the webhook is there:
-- eros.store.webhooks). Deliveries already orphaned, if any, go first so the new key holds.
DELETE FROM engine.webhook_deliveries d
WHERE NOT EXISTS (SELECT 1 FROM engine.app_webhooks w WHERE w.app_id = d.app_id);

ALTER TABLE engine.webhook_deliveries
    DROP CONSTRAINT IF EXISTS webhook_deliveries_app_id_fkey,
    ADD CONSTRAINT webhook_deliveries_app_id_fkey FOREIGN KEY (app_id)
        REFERENCES engine.app_webhooks (app_id) ON DELETE CASCADE;

-- The sweep's pruning of what was delivered a day ago.
CREATE INDEX IF NOT EXISTS webhook_deliveries_delivered_idx ON engine.webhook_deliveries (delivered_at)
    WHERE delivered_at IS NOT NULL;
