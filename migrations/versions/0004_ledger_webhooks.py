"""The usage ledger and the webhook outbox: a row per caller, tenant, resource and day,
the ids of the ledger flushes that committed, and the events waiting to be sent.

Revision ID: 0004_ledger_webhooks
Revises: 0003_concurrency_units
Create Date: 2026-12-03 22:30:00

New tables only: existing rows are untouched, and the ledger starts empty (it records
from the moment QUOTA_LEDGER is on).
"""
from alembic import op
import sqlalchemy as sa


revision = '0004_ledger_webhooks'
down_revision = '0003_concurrency_units'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'quota_usage',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('caller', sa.String(length=200), nullable=False),
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('resource', sa.String(length=64), nullable=False),
        sa.Column('units', sa.BigInteger(), nullable=False),
        sa.Column('requests', sa.BigInteger(), nullable=False),
        sa.Column('denied', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_usage')),
        sa.UniqueConstraint(
            'day', 'caller', 'tenant', 'resource',
            name=op.f('uq_quota_usage_day_caller_tenant_resource'),
        ),
    )
    with op.batch_alter_table('quota_usage', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_quota_usage_caller_day'), ['caller', 'day'], unique=False
        )
        batch_op.create_index(
            batch_op.f('ix_quota_usage_tenant_day'), ['tenant', 'day'], unique=False
        )

    op.create_table(
        'quota_usage_flushes',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_usage_flushes')),
    )
    with op.batch_alter_table('quota_usage_flushes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_quota_usage_flushes_at'), ['at'], unique=False)

    op.create_table(
        'quota_webhook_events',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('type', sa.String(length=32), nullable=False),
        sa.Column('created', sa.DateTime(timezone=True), nullable=False),
        sa.Column('data', sa.JSON(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('locked_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')",
            name=op.f('ck_quota_webhook_events_status'),
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_webhook_events')),
    )
    with op.batch_alter_table('quota_webhook_events', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_quota_webhook_events_status_next_attempt_at'),
            ['status', 'next_attempt_at'],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table('quota_webhook_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_quota_webhook_events_status_next_attempt_at'))
    op.drop_table('quota_webhook_events')
    with op.batch_alter_table('quota_usage_flushes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_quota_usage_flushes_at'))
    op.drop_table('quota_usage_flushes')
    with op.batch_alter_table('quota_usage', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_quota_usage_tenant_day'))
        batch_op.drop_index(batch_op.f('ix_quota_usage_caller_day'))
    op.drop_table('quota_usage')
